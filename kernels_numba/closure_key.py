"""A process-independent cache key for kernels made inside a function (closures), so the disk cache finds them again.

numba keys a cached kernel by its bytecode and, for a closure, by the pickled values of its free variables. Our kernel
factories (gemm_tc's per tile, prefill_tc's per option set, ...) close over device functions and intrinsics, and a
numba dispatcher pickles with a random uuid4: every process would make a new key, miss the cache and compile those
kernels again. Here a free variable that is a function, dispatcher or intrinsic is described by what it is made of
instead, its module, qualified name, bytecode and (recursively) its own free variables; any other value by its pickle
(ints, tile dataclasses, dtypes). Source changes elsewhere are covered by the cache directory's digest of every source
file (common.kernel_cache_dir).
"""
import hashlib
import pickle


def stable_token(value, depth: int = 0):
    """What a closure's free variable is, in terms that are equal in every process that builds the same kernel."""
    if depth > 8:  # (a function reaching itself through its closure)
        return "..."
    if isinstance(value, (bool, int, float, str, bytes, type(None))):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(stable_token(v, depth + 1) for v in value))
    # a numba dispatcher keeps its Python function in py_func, an @intrinsic its definition in _defn
    function = getattr(value, "py_func", None) or getattr(value, "_defn", None)
    if function is None and hasattr(value, "__code__"):
        function = value
    if function is not None and hasattr(function, "__code__"):
        cells = tuple(stable_token(cell.cell_contents, depth + 1) for cell in (function.__closure__ or ()))
        return ("function", function.__module__, function.__qualname__, code_token(function.__code__), cells)
    try:
        return pickle.dumps(value, protocol=4)
    except Exception:  # (a module, a lock...: the same object in every process that imports the same sources)
        return ("unpicklable", type(value).__module__, type(value).__qualname__)


def code_token(code) -> tuple:
    """A code object by its bytecode and constants, nested functions' code included (a code object's repr holds
    its address, which differs from process to process)."""
    consts = tuple(code_token(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts)
    return (code.co_name, hashlib.sha256(code.co_code).hexdigest(), consts)


def closure_digest(py_func) -> str:
    """sha256 of the stable tokens of py_func's free variables."""
    tokens = tuple(stable_token(cell.cell_contents) for cell in (py_func.__closure__ or ()))
    return hashlib.sha256(repr(tokens).encode()).hexdigest()


def stable_closure_cache(py_func):
    """numba-cuda's CUDACache for py_func with the closure part of its index key replaced by closure_digest.
    The key is (signature, codegen magic, numba-cuda version, (bytecode hash, closure hash)[, launch config])."""
    from numba.cuda.dispatcher import CUDACache

    class StableClosureCache(CUDACache):
        def _index_key(self, sig, codegen):
            key = super()._index_key(sig, codegen)
            code_hash, _ = key[3]
            return key[:3] + ((code_hash, closure_digest(self._py_func)),) + key[4:]

    return StableClosureCache(py_func)
