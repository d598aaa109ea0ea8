"""Hopper's warpgroup tensor-core product (wgmma) from numba.cuda: the instructions, their matrix descriptors, twins.

    D[64 x N] += A[64 x 16] @ B[16 x N]      A, B bf16 in shared memory; D float32 in the warpgroup's registers

PTX ISA section 9.7.15, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions". A warpgroup is 4
consecutive warps (128 threads, the first warp's index a multiple of 4); `wgmma.mma_async` is issued by all 128 and
runs asynchronously: the registers of D are written some time before the `wgmma.wait_group` that covers it.

Compiling for sm_90a. wgmma exists only for the architecture-specific target `sm_90a` (PTX ISA 11.1.2,
".target": "a" targets carry features of that one architecture and do not run elsewhere); PTX for `sm_90` with a
wgmma fails in ptxas. The routes, in the order to try them (docs/wgmma.md):
1. "numba" (the default): nothing to do. numba-cuda 0.30 (NVIDIA/numba-cuda PR 549, "Add arch specific target
   support") compiles every kernel for the current device's compute capability with the "a" suffix from 9.0 on
   (`CUDACodeLibrary._ensure_cc`: (9, 0, "a") on an H100/H200): NVVM gets `-arch=compute_90a`, the PTX says
   `.target sm_90a`, and the linker assembles for sm_90a. `cuda.compile_ptx(..., cc=(9, 0, "a"))` does the same
   without a GPU (the offline check of scripts/wgmma_smoke.py). Careful: `dispatcher.inspect_asm()` passes the
   device's (9, 0) without the suffix and so shows PTX for `sm_90`, not what runs; `kernel_ptx` below asks for the
   launched one.
2. "ptx" (TINYVLLM_WGMMA_ROUTE=ptx): for an NVVM that cannot target compute_90a. The kernel is compiled for plain
   compute_90 (numba's FORCE_CUDA_CC held at (9, 0) meanwhile; NVVM passes inline assembly through unread), and its
   PTX rewritten to `.target sm_90a` (and `.version` raised to 8.0, wgmma's PTX ISA, where older) before numba's
   own link assembles it for the device's sm_90a (`ptx_rewritten_for_sm90a`, `compile_through_ptx_rewrite`: the
   launch, argument packing included, stays numba's). It leans on numba-cuda 0.30's code library (get_asm_strs,
   _ptx_cache, _ensure_cc) and on its linker taking the "a" from the device.
3. Not implemented, in reserve: the wgmma in a PTX or CUDA C device function linked in (the jit's `link=[...]` with
   `cuda.declare_device`, or a `cuda.CUSource` that numba compiles through NVRTC for (9, 0, "a")), at the cost of
   passing the N / 2 accumulators through a call ABI; or the whole kernel as PTX loaded and launched through
   cuda.core (`Program(ptx, "ptx", ProgramOptions(arch="sm_90a"))`), packing numba's array arguments by hand.

The instructions, each an `@intrinsic` emitting inline PTX like mma.py's:
- `wgmma_fence()`: wgmma.fence.sync.aligned, before the first wgmma and after any other access to the registers a
  wgmma uses (9.7.15.7.1). Issued by every thread of the warpgroup.
- `wgmma_bf16(n)(acc, desc_a, desc_b)`: wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 (9.7.15.5.2) with A
  and B from shared memory through their descriptors, scale-d 1 (D += A B), no negation, no transposes (both
  K-major). `acc` is a thread's float32 local array of (at least) n / 2 accumulators, read and written in place
  (constant indices only, so they stay registers; the inline asm has n / 2 outputs tied to n / 2 inputs, the
  constraint string built here). n a multiple of 8, 8 to 256.
- `wgmma_bf16_rs(n)(acc, a0, a1, a2, a3, desc_b)`: the same product with A from registers (four bf16x2 words a
  thread: mma.sync's m16n8k16 A fragment, warp w of the warpgroup holding rows 16 w .. 16 w + 15) and B N-major
  (imm-trans-b 1: B's rows, the K dimension, are 128-byte swizzled rows of N; matrix_descriptor_sw128_mn). What
  attention's P @ V needs: P is the S = Q K^T accumulators packed to bf16 (an accumulator fragment's 16 columns
  16 p .. 16 p + 15 are the A fragment of k step p), V [keys, head_dim] is stored as it comes, keys along K.
- `wgmma_commit()`: wgmma.commit_group.sync.aligned, the wgmmas issued since the last one become a group.
- `wgmma_wait_group(n, count)(acc)`: wgmma.wait_group.sync.aligned n, wait until at most n groups are in flight;
  then each of the first `count` accumulators of `acc` passes through an empty asm tied to itself (CUTLASS's warpgroup_fence_operand), so
  the compiler cannot read D's registers before the wait (to LLVM the wgmma's outputs exist as soon as it issues).
- `accumulators_zero(count)(acc)`, `accumulators_stash(n)(tile, acc, row0, col0)`: acc set to 0, and acc stored
  through the fragment layout into a 2-D float32 array, every accumulator at a constant index: read or written in a
  loop with a run-time index, acc would live on the stack (LLVM unrolls no loop of 64-128 stores), in the K loop
  too.
- `matrix_descriptor_sw128_mn(address, leading_bytes)`: the descriptor of an N-major (MN-major) tile in the same
  128-byte swizzle: a 128-byte row holds 64 consecutive N of one K, 8 rows (K) make a 1,024-byte atom (SBO 1,024:
  the next 8 K), and the next 64 N lie `leading_bytes` on (LBO; unused where N <= 64). In CuTe's terms
  Swizzle<3,4,3> o ((64, m), (8, k)) : ((1, LBO), (64, SBO)) in bf16 (CUTLASS's make_gmma_desc, MN-major B128).
  Physically the same rows as a K-major tile of the transpose: V's tile [keys, 64] copied as K's is.
- `fence_proxy_async()`: fence.proxy.async.shared::cta. wgmma reads shared memory through the async proxy
  (9.7.15.4); what threads wrote there with st.shared or cp.async (the generic proxy) must be fenced before the
  barrier after which the wgmma reads it.
- `shared_address(smem, s, r, c)`: the 32-bit shared-window address of smem[s, r, c] (cvta.to.shared of a shared
  array's element, as mma.py's ldmatrix gets it: an address-space cast plus the index arithmetic).
- `matrix_descriptor(address, leading_bytes, stride_bytes)`: the 64-bit shared-memory matrix descriptor
  (9.7.15.5.1.2.2, "Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29 leading dimension byte
  offset >> 4, 32-45 stride dimension byte offset >> 4, 49-51 base offset (0), 62-63 swizzle mode (0: none).
  Each field is (x & 0x3FFFF) >> 4: 16-byte aligned values below 256 KB.
- `matrix_descriptor_sw128(address)`: the same for a tile in the 128-byte swizzle (mode 1 in bits 62-63, SBO 1,024):
  rows of 128 bytes (64 bf16 of K), the 16-byte chunk c of row r stored at chunk c ^ (r % 8), the tile 1,024-byte
  aligned (the XOR takes address bits 7-9). The k16 step s of a row starts 32 s bytes on: the hardware applies the
  XOR to the address it computes, so the descriptor's start simply advances. Conflict-free for wgmma's reads and
  for 8 threads writing one row's 8 chunks (CUTLASS's Swizzle<3, 4, 3>, `swizzle_128b`).

Shared memory layout (9.7.15.5.1.2, "Shared Memory Matrix Layout", K-major, no swizzle: "interleaved"). A core
matrix is 8 rows of 16 bytes (8 bf16 along K), stored as 128 contiguous bytes. The canonical K-major layout
without swizzle is, in CuTe terms with T = 8 bf16, ((8, m), (T, 2k)) : ((1T, SBO), (1, LBO)): row r of a core
matrix at r * 16 bytes, the next 8 rows (M or N) SBO bytes on ("Stride Dimension Byte Offset": "the offset from
the first 8 rows to the next 8 rows"), the next 8 K LBO bytes on ("Leading Dimension Byte Offset", K-major,
no-swizzling: "the offset from the first column to the second columns of the 8x2 tile"). The tiles here are
[K / 8, rows, 8] arrays of bf16, i.e. element (row, k) at ((k // 8) rows + row) 16 + (k % 8) 2 bytes: SBO = 128,
LBO = rows * 16, and the k16 step s of a tile starts at its column 16 s, (2 s) rows * 16 bytes in. A 16-byte chunk
of a global row (8 bf16 of K) lands as one row of a core matrix: one cp.async.

Accumulator fragment (9.7.15.5.1.1.1, Figure 149, "WGMMA .m64nNk16 register fragment layout for accumulator
matrix D"): thread t of the warpgroup, warp w = t // 32, lane = t % 32, holds d[j], j < N / 2, at
row 16 w + lane // 4 + 8 ((j // 2) % 2), column 8 (j // 4) + 2 (lane % 4) + j % 2: per warp, a 16-row band made of
N / 8 of mma.sync's 16 x 8 D fragments side by side (`fragment_position`).

In the simulator (no PTX) each is a Python twin. `shared_address` gives the element's byte offset from the start
of its shared allocation (each allocation a block makes gets its own window, 1,024-byte aligned, registered on the
block), and a descriptor is read back the way the hardware reads it: the emulated wgmma gathers A and B from the
window through the descriptor's start address, LBO and SBO, so a wrong descriptor or layout gives wrong results
in the simulator too. The 128 lanes meet at each wgmma (mma._WarpMeeting of 128): every lane must issue it and with
the same descriptors (asserted). The product lands as late as the hardware may land it: at the wait that covers
its group, reading shared memory then, D += A @ B in float64 rounded once to float32 into the lane's accumulators;
a kernel that reads D before waiting, or overwrites a tile a wgmma in flight still reads, gets stale values here
too.
"""
import functools
import os
from contextlib import contextmanager
import re
import threading

import numpy as np

from .common import SIMULATOR, jit

WARPGROUP = 128
WGMMA_K = 16
CORE_ROW_BYTES = 16     # a core matrix row: 8 bf16
CORE_MATRIX_BYTES = 128  # 8 rows of 16 bytes
ROUTES = ("numba", "ptx")
ROUTE_ENV = "TINYVLLM_WGMMA_ROUTE"


def wgmma_route(environ=os.environ) -> str:
    """How kernels are compiled for sm_90a: TINYVLLM_WGMMA_ROUTE, "numba" unless set (the module's docstring)."""
    route = environ.get(ROUTE_ENV, "numba")
    if route not in ROUTES:
        raise ValueError(f"{ROUTE_ENV}={route!r}: one of {', '.join(ROUTES)}")
    return route


WGMMA_ENV = "TINYVLLM_WGMMA"


def wgmma_available(environ=os.environ) -> bool:
    """Whether this process's GPU runs wgmma: compute capability 9.0 (Hopper), not the simulator, and
    TINYVLLM_WGMMA not "0"."""
    if SIMULATOR or environ.get(WGMMA_ENV, "1") == "0":
        return False
    from numba import cuda
    return tuple(cuda.get_current_device().compute_capability) == (9, 0)


def check_n(n: int) -> None:
    assert isinstance(n, int) and n % 8 == 0 and 8 <= n <= 256, f"wgmma m64nNk16: N {n!r} is not a multiple of 8 in 8-256"


@jit(device=True)
def matrix_descriptor(address, leading_bytes, stride_bytes):
    """The wgmma shared-memory matrix descriptor (no swizzle, base offset 0) of a K-major tile at `address`."""
    return np.uint64((np.uint64(address) & np.uint64(0x3FFFF)) >> np.uint64(4)
                     | ((np.uint64(leading_bytes) & np.uint64(0x3FFFF)) >> np.uint64(4)) << np.uint64(16)
                     | ((np.uint64(stride_bytes) & np.uint64(0x3FFFF)) >> np.uint64(4)) << np.uint64(32))


SWIZZLE_128B = 1          # descriptor bits 62-63: 0 none, 1 128-byte, 2 64-byte, 3 32-byte
SWIZZLE_ROW_BYTES = 128   # a 128-byte swizzled row: 64 bf16 of K
SWIZZLE_ATOM_BYTES = 1024  # 8 such rows: the XOR pattern repeats, the tile's alignment


@jit(device=True)
def matrix_descriptor_sw128(address):
    """The descriptor of a K-major tile in the 128-byte swizzle (rows of 64 bf16, 16-byte chunk c of row r stored at
    chunk c ^ (r % 8), 8-row groups 1,024 bytes apart: SBO 1,024; LBO unused, 16 by convention)."""
    return np.uint64((np.uint64(address) & np.uint64(0x3FFFF)) >> np.uint64(4)
                     | np.uint64(1) << np.uint64(16)
                     | np.uint64(SWIZZLE_ATOM_BYTES >> 4) << np.uint64(32)
                     | np.uint64(SWIZZLE_128B) << np.uint64(62))


@jit(device=True)
def matrix_descriptor_sw128_mn(address, leading_bytes):
    """The descriptor of an N-major tile in the 128-byte swizzle (rows of 64 bf16 of N, one K each; 8-row atoms
    1,024 bytes apart: SBO 1,024; the next 64 N `leading_bytes` on: LBO)."""
    return np.uint64((np.uint64(address) & np.uint64(0x3FFFF)) >> np.uint64(4)
                     | ((np.uint64(leading_bytes) & np.uint64(0x3FFFF)) >> np.uint64(4)) << np.uint64(16)
                     | np.uint64(SWIZZLE_ATOM_BYTES >> 4) << np.uint64(32)
                     | np.uint64(SWIZZLE_128B) << np.uint64(62))


def swizzle_128b(byte_address):
    """Where the 128-byte swizzle stores the byte at `byte_address` (an address from a 1,024-byte aligned tile):
    its 16-byte chunk index (bits 4-6) XOR the row within the 8-row atom (bits 7-9)."""
    return byte_address ^ (((byte_address >> 7) & 7) << 4)


def decode_descriptor(descriptor) -> tuple[int, int, int, int]:
    """(start address, leading byte offset, stride byte offset, swizzle mode) of a descriptor."""
    d = int(descriptor)
    return (d & 0x3FFF) << 4, ((d >> 16) & 0x3FFF) << 4, ((d >> 32) & 0x3FFF) << 4, (d >> 62) & 3


def fragment_position(thread: int, j: int) -> tuple[int, int]:
    """(row, column) of D that accumulator j of warpgroup thread `thread` holds (m64nNk16, Figure 149)."""
    warp, lane = thread // 32, thread % 32
    return 16 * warp + lane // 4 + 8 * ((j // 2) % 2), 8 * (j // 4) + 2 * (lane % 4) + j % 2


def k_major_offsets(rows: int, leading_bytes: int, stride_bytes: int) -> np.ndarray:
    """Byte offsets [rows, 16] from the start address of element (row, k) of a K-major, unswizzled operand."""
    r = np.arange(rows)[:, None]
    k = np.arange(WGMMA_K)[None, :]
    return (r // 8) * stride_bytes + (r % 8) * CORE_ROW_BYTES + (k // 8) * leading_bytes + (k % 8) * 2


if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    from numba.cuda import cgutils

    from .mma import _shared_address

    def _asm(builder, text, constraints="~{memory}"):
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, constraints, side_effect=True)
        builder.call(asm, [])

    def _accumulator_pointers(context, builder, array_type, array, count):
        data = context.make_array(array_type)(context, builder, value=array).data
        return [builder.gep(data, [ir.Constant(ir.IntType(32), j)]) for j in range(count)]

    def _check_accumulators(name, acc):
        if not isinstance(acc, types.Array) or acc.ndim != 1 or acc.dtype != types.float32:
            raise TypeError(f"{name} wants a 1-D float32 (local) array of accumulators, got {acc}")

    @intrinsic
    def wgmma_fence(typingctx):
        def codegen(context, builder, signature, args):
            _asm(builder, "wgmma.fence.sync.aligned;")
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def wgmma_commit(typingctx):
        def codegen(context, builder, signature, args):
            _asm(builder, "wgmma.commit_group.sync.aligned;")
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def fence_proxy_async(typingctx):
        def codegen(context, builder, signature, args):
            _asm(builder, "fence.proxy.async.shared::cta;")
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def shared_address(typingctx, smem, s, r, c):
        if not isinstance(smem, types.Array) or smem.ndim != 3:
            raise TypeError(f"shared_address wants a 3-D shared array, got {smem}")
        sig = types.uint32(smem, s, r, c)

        def codegen(context, builder, signature, args):
            return _shared_address(context, builder, signature.args[0], args[0], signature.args[1:], args[1:])

        return sig, codegen

    @functools.cache
    def wgmma_wait_group(n: int, count: int):
        """The device function wait(acc): wgmma.wait_group n, then acc's first `count` registers pinned after it."""
        assert isinstance(n, int) and n >= 0, n

        @intrinsic
        def wait(typingctx, acc):
            _check_accumulators("wgmma_wait_group", acc)

            def codegen(context, builder, signature, args):
                _asm(builder, f"wgmma.wait_group.sync.aligned {n};")
                f32 = ir.FloatType()
                pin = ir.InlineAsm(ir.FunctionType(f32, [f32]), "", "=f,0", side_effect=True)
                for pointer in _accumulator_pointers(context, builder, signature.args[0], args[0], count):
                    builder.store(builder.call(pin, [builder.load(pointer)]), pointer)
                return context.get_dummy_value()

            return types.void(acc), codegen

        return wait

    @functools.cache
    def wgmma_bf16(n: int):
        """The device function mma(acc, desc_a, desc_b) issuing wgmma.mma_async m64n{n}k16 f32 += bf16 x bf16."""
        check_n(n)
        count = n // 2
        outputs = ", ".join(f"${j}" for j in range(count))
        text = (f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{outputs}}}, ${2 * count}, "
                f"${2 * count + 1}, 1, 1, 1, 0, 0;")
        # outputs 0..count-1, the same registers as inputs count..2count-1 (tied), then the two descriptors
        constraints = ",".join(["=f"] * count + [str(j) for j in range(count)] + ["l", "l", "~{memory}"])

        @intrinsic
        def mma(typingctx, acc, desc_a, desc_b):
            _check_accumulators(f"wgmma_bf16({n})", acc)
            sig = types.void(acc, types.uint64, types.uint64)

            def codegen(context, builder, signature, args):
                f32, i64 = ir.FloatType(), ir.IntType(64)
                pointers = _accumulator_pointers(context, builder, signature.args[0], args[0], count)
                descriptors = [context.cast(builder, v, t, types.uint64)
                               for v, t in zip(args[1:], signature.args[1:])]
                asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([f32] * count), [f32] * count + [i64, i64]),
                                   text, constraints, side_effect=True)
                result = builder.call(asm, [builder.load(p) for p in pointers] + descriptors)
                for j, pointer in enumerate(pointers):
                    builder.store(builder.extract_value(result, j), pointer)
                return context.get_dummy_value()

            return sig, codegen

        return mma

    @functools.cache
    def wgmma_bf16_rs(n: int):
        """The device function mma(acc, a0, a1, a2, a3, desc_b) issuing wgmma.mma_async m64n{n}k16 f32 += bf16 x bf16
        with A from registers (four bf16x2 words) and B N-major (imm-trans-b 1)."""
        check_n(n)
        count = n // 2
        outputs = ", ".join(f"${j}" for j in range(count))
        a = ", ".join(f"${2 * count + i}" for i in range(4))
        text = (f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{outputs}}}, {{{a}}}, ${2 * count + 4}, "
                f"1, 1, 1, 1;")
        constraints = ",".join(["=f"] * count + [str(j) for j in range(count)] + ["r"] * 4 + ["l", "~{memory}"])

        @intrinsic
        def mma(typingctx, acc, a0, a1, a2, a3, desc_b):
            _check_accumulators(f"wgmma_bf16_rs({n})", acc)
            sig = types.void(acc, types.uint32, types.uint32, types.uint32, types.uint32, types.uint64)

            def codegen(context, builder, signature, args):
                f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
                pointers = _accumulator_pointers(context, builder, signature.args[0], args[0], count)
                words = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[1:5], signature.args[1:5])]
                descriptor = context.cast(builder, args[5], signature.args[5], types.uint64)
                signature_ir = ir.FunctionType(ir.LiteralStructType([f32] * count), [f32] * count + [i32] * 4 + [i64])
                asm = ir.InlineAsm(signature_ir, text, constraints, side_effect=True)
                result = builder.call(asm, [builder.load(p) for p in pointers] + words + [descriptor])
                for j, pointer in enumerate(pointers):
                    builder.store(builder.extract_value(result, j), pointer)
                return context.get_dummy_value()

            return sig, codegen

        return mma

    @functools.cache
    def accumulators_zero(count: int):
        """The device function zero(acc): acc[0:count] = 0, each at a constant index (so acc stays registers)."""
        @intrinsic
        def zero(typingctx, acc):
            _check_accumulators("accumulators_zero", acc)

            def codegen(context, builder, signature, args):
                for pointer in _accumulator_pointers(context, builder, signature.args[0], args[0], count):
                    builder.store(ir.Constant(ir.FloatType(), 0.0), pointer)
                return context.get_dummy_value()

            return types.void(acc), codegen

        return zero

    @functools.cache
    def accumulators_stash(n: int):
        """The device function stash(tile, acc, row0, col0): tile[row0 + r, col0 + c] = acc[j] for the N / 2
        accumulators of an m64nNk16 fragment (r = 8 ((j / 2) % 2), c = 8 (j / 4) + j % 2; row0, col0 the thread's
        own part of fragment_position), each at a constant index (so acc stays registers: a loop over acc with a
        run-time index would put it on the stack, in the K loop too)."""
        check_n(n)
        count = n // 2

        @intrinsic
        def stash(typingctx, tile, acc, row0, col0):
            _check_accumulators("accumulators_stash", acc)
            if not isinstance(tile, types.Array) or tile.ndim != 2 or tile.dtype != types.float32:
                raise TypeError(f"accumulators_stash wants a 2-D float32 array, got {tile}")

            def codegen(context, builder, signature, args):
                tile_type = signature.args[0]
                array = context.make_array(tile_type)(context, builder, value=args[0])
                row = context.cast(builder, args[2], signature.args[2], types.intp)
                col = context.cast(builder, args[3], signature.args[3], types.intp)
                pointers = _accumulator_pointers(context, builder, signature.args[1], args[1], count)
                for j, pointer in enumerate(pointers):
                    indices = [builder.add(row, context.get_constant(types.intp, 8 * ((j // 2) % 2))),
                               builder.add(col, context.get_constant(types.intp, 8 * (j // 4) + j % 2))]
                    target = cgutils.get_item_pointer(context, builder, tile_type, array, indices, wraparound=False)
                    builder.store(builder.load(pointer), target)
                return context.get_dummy_value()

            return types.void(tile, acc, row0, col0), codegen

        return stash


else:
    from .mma import _WarpMeeting

    _registry_lock = threading.Lock()

    def _block_state():
        """(this thread's index in the block, the block's manager): the simulator's thread says which it is."""
        thread = threading.current_thread()
        manager = getattr(thread, "_manager", None)
        assert manager is not None, "a wgmma op runs inside a kernel"
        return thread, manager

    def _windows(manager) -> dict:
        """The block's shared allocations: data address -> [window start, the array] (an allocation may be seen
        through several numpy arrays, one per thread: the simulator's dynamic shared memory)."""
        with _registry_lock:
            return manager.__dict__.setdefault("_wgmma_windows", {})

    def _root(array: np.ndarray) -> np.ndarray:
        while isinstance(array.base, np.ndarray):
            array = array.base
        return array

    def shared_address(smem, s, r, c):
        thread, manager = _block_state()
        root = _root(smem)
        root_address = root.__array_interface__["data"][0]
        windows = _windows(manager)
        with _registry_lock:
            if root_address not in windows:
                end = max((start + entry.nbytes for start, entry in windows.values()), default=0)
                windows[root_address] = (-(-end // SWIZZLE_ATOM_BYTES) * SWIZZLE_ATOM_BYTES, root)
            window = windows[root_address][0]
        element = smem.__array_interface__["data"][0] + sum(
            int(i) * stride for i, stride in zip((s, r, c), smem.strides))
        return np.uint32(window + element - root_address)

    def _read_operand(manager, descriptor, rows: int, n_major: bool = False) -> np.ndarray:
        """The [rows, 16] bf16 operand a descriptor names (rows: M or N; n_major: B stored N-major, the 128-byte
        swizzle only), as float64, read from the block's shared windows."""
        start, leading, stride, swizzle = decode_descriptor(descriptor)
        assert swizzle in (0, SWIZZLE_128B), f"the simulator emulates no swizzle and the 128-byte one, not {swizzle}"
        if n_major:  # N along a 128-byte row (64 of them, the next 64 LBO on), K down the rows (8 a 1,024-byte atom)
            assert swizzle == SWIZZLE_128B, "the simulator emulates N-major operands in the 128-byte swizzle only"
            r, k = np.arange(rows)[:, None], np.arange(WGMMA_K)[None, :]
            offsets = swizzle_128b(start + (r // 64) * leading + (r % 64) * 2 + (k // 8) * stride
                                   + (k % 8) * SWIZZLE_ROW_BYTES)
        elif swizzle == SWIZZLE_128B:  # rows 128 bytes apart within an 8-row atom; k's 32 bytes inside one row
            r, k = np.arange(rows)[:, None], np.arange(WGMMA_K)[None, :]
            offsets = swizzle_128b(start + (r // 8) * stride + (r % 8) * SWIZZLE_ROW_BYTES + k * 2)
        else:
            offsets = start + k_major_offsets(rows, leading, stride)
        low, high = int(offsets.min()), int(offsets.max()) + 2
        for window, root in _windows(manager).values():
            if window <= low and high <= window + root.nbytes:
                raw = root.reshape(-1).view(np.uint8)
                local = offsets - window
                bits = raw[local].astype(np.uint32) | (raw[local + 1].astype(np.uint32) << 8)
                return (bits << 16).astype(np.uint32).view(np.float32).astype(np.float64)
        raise AssertionError(f"wgmma operand at shared bytes {low}..{high} lies in no shared allocation of the block "
                             f"(descriptor {int(descriptor):#x})")

    def _wgmma_groups(thread):
        """This simulated thread's wgmmas in flight: committed groups, then the open one."""
        if not hasattr(thread, "_wgmma_groups"):
            thread._wgmma_groups = [[]]
        return thread._wgmma_groups

    def _meeting(thread, manager):
        block_threads = int(np.prod(manager._block_dim))
        assert block_threads % WARPGROUP == 0, f"wgmma needs whole warpgroups: a block of {block_threads} threads"
        with _registry_lock:
            meetings = manager.__dict__.setdefault("_warpgroup_meetings", {})
            meeting = meetings.setdefault(thread.thread_id // WARPGROUP, _WarpMeeting(WARPGROUP))
        return thread.thread_id % WARPGROUP, meeting

    def wgmma_fence():
        pass

    def fence_proxy_async():
        pass

    def wgmma_commit():
        thread, _ = _block_state()
        _wgmma_groups(thread).append([])

    @functools.cache
    def wgmma_bf16(n: int):
        check_n(n)

        def mma(acc, desc_a, desc_b):
            thread, manager = _block_state()
            lane, meeting = _meeting(thread, manager)
            phase = meeting.meet(lane, (int(desc_a), int(desc_b)), thread)
            first = meeting.operands[phase][0]
            assert all(o == first for o in meeting.operands[phase]), (
                "wgmma: the warpgroup's threads issued different descriptors (they must be the same in every thread)")
            _wgmma_groups(thread)[-1].append((n, acc, desc_a, desc_b, lane))

        return mma

    def _register_operand(words) -> np.ndarray:
        """The [64, 16] A of a wgmma from its 128 lanes' four bf16x2 words (mma.sync's A fragment, warp by warp:
        word 0 rows g, columns 2 q, 2 q + 1; word 1 rows g + 8; words 2, 3 the same at columns + 8)."""
        words = np.asarray(words, np.uint32)  # [128 lanes, 4]
        lane = np.arange(WARPGROUP)[:, None]
        word = np.arange(4)[None, :]
        rows = 16 * (lane // 32) + (lane % 32) // 4 + 8 * (word % 2)
        cols = 2 * (lane % 4) + 8 * (word // 2)
        a = np.zeros((64, WGMMA_K), np.float64)
        a[rows, cols] = ((words & 0xFFFF) << 16).view(np.float32)
        a[rows, cols + 1] = (words & 0xFFFF0000).view(np.float32)
        return a

    @functools.cache
    def wgmma_bf16_rs(n: int):
        check_n(n)

        def mma(acc, a0, a1, a2, a3, desc_b):
            thread, manager = _block_state()
            lane, meeting = _meeting(thread, manager)
            phase = meeting.meet(lane, ((int(a0), int(a1), int(a2), int(a3)), int(desc_b)), thread)
            operands = meeting.operands[phase]
            assert all(o[1] == operands[0][1] for o in operands), (
                "wgmma: the warpgroup's threads issued different descriptors (they must be the same in every thread)")
            with _registry_lock:  # A is read at issue (registers may change after it), once for the 128 lanes
                if meeting.results[phase] is None:
                    meeting.results[phase] = _register_operand([o[0] for o in operands])
                a = meeting.results[phase]
            _wgmma_groups(thread)[-1].append((n, acc, a, desc_b, lane))

        return mma

    @functools.cache
    def accumulators_zero(count: int):
        def zero(acc):
            acc[:count] = np.float32(0.0)

        return zero

    @functools.cache
    def accumulators_stash(n: int):
        check_n(n)

        def stash(tile, acc, row0, col0):
            for j in range(n // 2):
                tile[row0 + 8 * ((j // 2) % 2), col0 + 8 * (j // 4) + j % 2] = acc[j]

        return stash

    def _land(manager, op):
        n, acc, a, desc_b, lane = op
        registers_a = isinstance(a, np.ndarray)  # wgmma_bf16_rs's A, read at issue; its B is N-major
        a = a if registers_a else _read_operand(manager, a, 64)
        b = _read_operand(manager, desc_b, n, n_major=registers_a)
        d = a @ b.T
        for j in range(n // 2):
            row, col = fragment_position(lane, j)
            acc[j] = np.float32(np.float64(acc[j]) + d[row, col])

    @functools.cache
    def wgmma_wait_group(n: int, count: int):
        assert isinstance(n, int) and n >= 0, n

        def wait(acc):  # the products land as late as the hardware may land them: when a wait covers their group
            thread, manager = _block_state()
            groups = _wgmma_groups(thread)
            committed = len(groups) - 1
            while committed > n:
                for op in groups.pop(0):
                    _land(manager, op)
                committed -= 1

        return wait


def wgmma_ref(a_bits: np.ndarray, b_bits: np.ndarray, d: np.ndarray) -> np.ndarray:
    """numpy twin of one m64nNk16 on whole tiles: a [64, 16] and b [N, 16] (K-major: B's rows are its columns) bf16
    bits, d [64, N] float32; D + A @ B.T in float64, rounded once to float32."""
    import ml_dtypes
    a = a_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    b = b_bits.view(ml_dtypes.bfloat16).astype(np.float64)
    return (d.astype(np.float64) + a @ b.T).astype(np.float32)


TARGET_LINE = re.compile(r"^\s*\.target\s+(\S+?)(\s*,.*)?$", re.M)
VERSION_LINE = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.M)


def ptx_target(ptx: str) -> str:
    """The `.target` line of a PTX module ('?' if none)."""
    match = TARGET_LINE.search(ptx)
    return match.group(0).strip() if match else "?"


def sm90a_ptx(ptx: str) -> str:
    """PTX for sm_90 made PTX for sm_90a: the `.target` line's architecture, and `.version` at least 8.0."""
    assert TARGET_LINE.search(ptx), "PTX without a .target line"
    ptx = TARGET_LINE.sub(lambda m: f".target sm_90a{m.group(2) or ''}", ptx, count=1)
    version = VERSION_LINE.search(ptx)
    if version and (int(version.group(1)), int(version.group(2))) < (8, 0):
        ptx = VERSION_LINE.sub(".version 8.0", ptx, count=1)
    return ptx


@contextmanager
def ptx_rewritten_for_sm90a():
    """Route "ptx", while it lasts: NVVM compiles for plain compute_90 (numba's FORCE_CUDA_CC held at (9, 0)), and every
    PTX a code library makes (CUDACodeLibrary.get_asm_strs, which its linking reads too) is rewritten by sm90a_ptx
    and kept so in its cache, so numba's own link assembles it for the device's sm_90a. Not thread-safe (it patches
    numba-cuda 0.30's class for the duration): compile nothing else meanwhile."""
    from numba.cuda import config
    from numba.cuda.codegen import CUDACodeLibrary

    original = CUDACodeLibrary.get_asm_strs

    def rewritten(library, cc=None):
        ptxes = [sm90a_ptx(ptx) for ptx in original(library, cc=cc)]
        library._ptx_cache[library._ensure_cc(cc)] = ptxes
        return ptxes

    held = config.FORCE_CUDA_CC
    config.FORCE_CUDA_CC = (9, 0)  # NVVM's -arch (nvrtc.get_arch_option reads it): compute_90, no "a"
    CUDACodeLibrary.get_asm_strs = rewritten
    try:
        yield
    finally:
        CUDACodeLibrary.get_asm_strs = original
        config.FORCE_CUDA_CC = held


def compile_through_ptx_rewrite(kernel, args):
    """Route "ptx": compile (and load) `kernel` for these arguments with its PTX rewritten for sm_90a, before its
    first launch, which then finds the overload compiled. GPU only."""
    signature = tuple(kernel.typeof_pyval(a) for a in args)
    with ptx_rewritten_for_sm90a():
        return kernel.compile(signature)


def kernel_ptx(kernel, args) -> str:
    """The PTX the launch of `kernel` with these arguments assembles (for the current device, its "a" target
    included: not dispatcher.inspect_asm, which asks for the capability without the suffix). GPU only."""
    overload = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    return overload._codelibrary.get_asm_str()
