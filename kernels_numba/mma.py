"""Tensor-core building blocks: one bf16 matrix product per warp, its fragment loads, and async copies.

    D[16x8] = A[16x16] @ B[16x8] + C      A, B bf16; C, D float32 (each product exact, the sum in fp32)

numba-cuda has no tensor-core API, so on the GPU each block is an `@intrinsic` that emits one PTX
instruction as inline assembly (llvmlite ir.InlineAsm, as numba-cuda's own cache-hint loads do):
- `mma_bf16_m16n8k16(a0..a3, b0, b1, c0..c3) -> (d0..d3)`: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32,
  a warp-collective op: the 32 lanes each hold a fragment of A, B, C and get one of D. Lane = 4 g + t
  (g = lane >> 2, t = lane & 3); a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
  b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; d0, d1 = D[g][2t..2t+1], d2, d3 = D[g+8][2t..2t+1]. Two bf16 pack
  into a uint32, the lower column (or k) in the low 16 bits (`pack_bf16x2`).
- `ldmatrix_x4(smem, s, r, c) -> (r0..r3)`: ldmatrix.sync.aligned.m8n8.x4.shared.b16, a warp-collective load
  of four 8x8 bf16 matrices from shared memory. Lane l names the address of one row: row l % 8 of matrix
  l // 8, starting at smem[s, r, c] (8 consecutive bf16, 16-byte aligned); every lane gets, of each matrix
  i, row lane // 4, columns 2 (lane % 4) and + 1, packed, in register i: exactly an mma fragment. With
  lanes 0-15 naming rows 0-15 at column k and lanes 16-31 the same rows at k + 8 it returns a0..a3 of a
  16x16 tile of A; from a weight tile W[n][k] (= B in "col" layout), b0 and b1 of two 8-column tiles.
- `ldmatrix_x4_trans(smem, s, r, c)`: the same with each 8x8 matrix transposed: lane 4g + t gets column g,
  rows 2t and 2t + 1. From a tile stored [k][n] (V in attention: [key][dim]) with the A pattern of lane
  addresses it returns b0, b1 of two 8-column tiles, as ldmatrix_x4 does from one stored [n][k].
- `shfl_xor(value, lane_mask)`: the value of lane `lane ^ lane_mask` (shfl.sync.bfly; the four lanes of a
  quad share an mma row: lane masks 1 and 2 reduce over them).
- `cp_async_16(smem, s, r, c, gmem, gr, gc, src_bytes)`: cp.async.cg.shared.global, 16 bytes (8 bf16) from
  gmem[gr, gc:gc+8] to smem[s, r, c:c+8] without passing through registers; src_bytes 0 fills zeros
  instead (tile edges). `cp_async_commit()` closes a group of copies, `cp_async_wait_group(n)` makes the
  kernel-side function that waits until at most n groups are still in flight (n is part of the
  instruction). A syncthreads after the wait publishes the data to the block.
- `pack_f32_bf16x2(lo, hi) -> uint32`: cvt.rn.bf16x2.f32, two float32 rounded to bf16 (nearest even) and packed,
  lo in the low half, in one instruction: pack_bf16x2(f32_to_bf16(lo), f32_to_bf16(hi)) bit for bit except a NaN
  (the hardware's canonical 0x7FFF, f32_to_bf16's 0x7FC0).
- `exp2_approx(x) -> 2^x`: ex2.approx.ftz.f32, one instruction of the special-function unit (relative error
  about 2 ulp, 2^-22; results below 2^-126 flushed to 0; 2^-inf = 0). math.exp compiles to libdevice's
  expf, several instructions around the same ex2 to reach 1 ulp.
- `load_x4(array, i, j) -> 4 values`: ld.global.nc.v4 (one 128-bit load of 4 32-bit elements,
  array[i, j:j+4]; j a multiple of 4 and rows 16-byte aligned).
- `shared_view(shape)(flat, start)`: flat[start : start + prod(shape)] as a C-contiguous array of `shape`, for
  carving tiles out of the one dynamic shared array (`cuda.shared.array(0, dtype)`, sized at launch: past the 48
  KB a block may declare statically). No instruction: an array whose shape and strides are compile-time constants
  (numba's reshape would compute strides at run time in a linked helper), so indexing the view compiles to the
  same address arithmetic as a static shared array's. Nothing checks that the view fits: the launch's size must.

In the simulator (no PTX) each is a Python twin with the same arguments and results, so a tiled kernel built
from them runs there unchanged. A simulated CUDA thread is a Python thread, so the warp-collective twins make
the warp's 32 lanes meet: each lane leaves its operands in its warp's slot, waits for the other 31 (a
barrier of the warp alone, `_WarpMeeting`), then reads what it needs of everyone's operands (double
buffered, so one barrier per op). The twin mma computes D = C + A @ B in float64 and rounds once to float32
(an ideal tensor core). A copy lands as late as the hardware may land it: cp_async_16 only records it in the
thread's open group, and the copies of a committed group land when the thread waits with that group among those
it must not leave in flight (never, without such a wait). A kernel that reads a stage it has not waited for then
reads stale data in the simulator too; one that forgets the syncthreads after the wait is caught only when
the simulated warps happen to interleave badly.
"""
import functools
import threading

import numpy as np

from .bf16 import f32_to_bf16
from .common import SIMULATOR, cuda, jit

WARP = 32
FULL_WARP = 0xFFFFFFFF


@jit(device=True)
def pack_bf16x2(lo, hi):
    """Two bf16 bit patterns in one uint32 register, `lo` in the low half (an mma fragment register)."""
    return np.uint32(np.uint32(lo) | (np.uint32(hi) << np.uint32(16)))


if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    def _element_pointer(context, builder, array_type, array, index_types, indices):
        """The address of array[indices] (no wraparound, no bounds check), as numba's cache-hint loads get it."""
        intp_indices = [context.cast(builder, value, typ, types.intp) for value, typ in zip(indices, index_types)]
        array_struct = context.make_array(array_type)(context, builder, value=array)
        return cgutils.get_item_pointer(context, builder, array_type, array_struct, intp_indices, wraparound=False)

    def _shared_address(context, builder, array_type, array, index_types, indices):
        """The 32-bit shared-window address of array[indices] (a shared array): the array's base cast to the shared
        window once (an address-space cast the compiler sees through and shares between calls, not a cvta inside
        each asm) plus each index times its stride, every term in 32-bit integers (the shared window is far below
        2^32 bytes: the same address as the 64-bit sum truncated). Built in 32 bits from the start, not as a 64-bit
        offset truncated at the end, which would keep the compiler from moving constant offsets past the base (an
        add before each ldmatrix): the base and a lane's part are one register and each constant offset folds into
        the instruction's immediate (LDSM [R+0x900]; the instruction counts offline: docs/bench-h200.md)."""
        array_struct = context.make_array(array_type)(context, builder, value=array)
        i32 = ir.IntType(32)
        data = array_struct.data
        address = builder.ptrtoint(builder.addrspacecast(data, ir.PointerType(data.type.pointee, 3)), i32)
        strides = cgutils.unpack_tuple(builder, array_struct.strides, array_type.ndim)
        for value, typ, stride in zip(indices, index_types, strides):
            index = builder.trunc(context.cast(builder, value, typ, types.intp), i32)
            address = builder.add(address, builder.mul(index, builder.trunc(stride, i32)))
        return address

    def _check_array(name, array, ndim, bitwidth=16):
        if not isinstance(array, types.Array) or array.ndim != ndim or array.dtype.bitwidth != bitwidth:
            raise TypeError(f"{name} wants a {ndim}-D array of {bitwidth}-bit elements, got {array}")

    @intrinsic
    def mma_bf16_m16n8k16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        sig = types.UniTuple(types.float32, 4)(*([types.uint32] * 6 + [types.float32] * 4))

        def codegen(context, builder, signature, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            args = [context.cast(builder, v, t, want) for v, t, want in zip(args, signature.args, sig.args)]
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            asm = ir.InlineAsm(fnty, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                                     "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                               "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", side_effect=True)
            result = builder.call(asm, args)
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_value(result, k) for k in range(4)])

        return sig, codegen

    @intrinsic
    def ldmatrix_x4(typingctx, smem, s, r, c):
        _check_array("ldmatrix_x4", smem, 3)
        sig = types.UniTuple(types.uint32, 4)(smem, s, r, c)

        def codegen(context, builder, signature, args):
            address = _shared_address(context, builder, signature.args[0], args[0], signature.args[1:], args[1:])
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
            asm = ir.InlineAsm(fnty, "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0,$1,$2,$3}, [$4];",
                               "=r,=r,=r,=r,r,~{memory}", side_effect=True)
            result = builder.call(asm, [address])
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_value(result, k) for k in range(4)])

        return sig, codegen

    @intrinsic
    def ldmatrix_x4_trans(typingctx, smem, s, r, c):
        _check_array("ldmatrix_x4_trans", smem, 3)
        sig = types.UniTuple(types.uint32, 4)(smem, s, r, c)

        def codegen(context, builder, signature, args):
            address = _shared_address(context, builder, signature.args[0], args[0], signature.args[1:], args[1:])
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32])
            asm = ir.InlineAsm(fnty, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0,$1,$2,$3}, [$4];",
                               "=r,=r,=r,=r,r,~{memory}", side_effect=True)
            result = builder.call(asm, [address])
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_value(result, k) for k in range(4)])

        return sig, codegen

    @jit(device=True)
    def shfl_xor(value, lane_mask):
        return cuda.shfl_xor_sync(FULL_WARP, value, lane_mask)

    @intrinsic
    def cp_async_16(typingctx, smem, s, r, c, gmem, gr, gc, src_bytes):
        _check_array("cp_async_16 (shared)", smem, 3)
        _check_array("cp_async_16 (global)", gmem, 2)
        sig = types.void(smem, s, r, c, gmem, gr, gc, src_bytes)

        def codegen(context, builder, signature, args):
            shared = _shared_address(context, builder, signature.args[0], args[0], signature.args[1:4], args[1:4])
            source = _element_pointer(context, builder, signature.args[4], args[4], signature.args[5:7], args[5:7])
            size = context.cast(builder, args[7], signature.args[7], types.uint32)
            fnty = ir.FunctionType(ir.VoidType(), [shared.type, source.type, ir.IntType(32)])
            asm = ir.InlineAsm(fnty, "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                               side_effect=True)
            builder.call(asm, [shared, source, size])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def cp_async_commit(typingctx):
        def codegen(context, builder, signature, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "cp.async.commit_group;", "~{memory}",
                               side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()

        return types.void(), codegen

    @functools.cache
    def cp_async_wait_group(n: int):
        """A device function waiting until at most n committed groups of this thread's copies are in flight."""
        assert n >= 0

        @intrinsic
        def wait(typingctx):
            def codegen(context, builder, signature, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), f"cp.async.wait_group {n};", "~{memory}",
                                   side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()

            return types.void(), codegen

        return wait

    @intrinsic
    def pack_f32_bf16x2(typingctx, lo, hi):
        sig = types.uint32(types.float32, types.float32)

        def codegen(context, builder, signature, args):
            lo_value = context.cast(builder, args[0], signature.args[0], types.float32)
            hi_value = context.cast(builder, args[1], signature.args[1], types.float32)
            f32, i32 = ir.FloatType(), ir.IntType(32)
            # d = {bf16(a) in the upper half, bf16(b) in the lower}
            asm = ir.InlineAsm(ir.FunctionType(i32, [f32, f32]), "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")
            return builder.call(asm, [hi_value, lo_value])

        return sig, codegen

    @intrinsic
    def exp2_approx(typingctx, x):
        sig = types.float32(types.float32)

        def codegen(context, builder, signature, args):
            value = context.cast(builder, args[0], signature.args[0], types.float32)
            f32 = ir.FloatType()
            asm = ir.InlineAsm(ir.FunctionType(f32, [f32]), "ex2.approx.ftz.f32 $0, $1;", "=f,f")
            return builder.call(asm, [value])

        return sig, codegen

    @intrinsic
    def load_x4(typingctx, array, i, j):
        _check_array("load_x4", array, 2, 32)
        sig = types.UniTuple(array.dtype, 4)(array, i, j)

        def codegen(context, builder, signature, args):
            pointer = _element_pointer(context, builder, signature.args[0], args[0], signature.args[1:], args[1:])
            element = context.get_value_type(signature.args[0].dtype)
            kind, constraint = ("f32", "f") if isinstance(signature.args[0].dtype, types.Float) else ("u32", "r")
            fnty = ir.FunctionType(ir.LiteralStructType([element] * 4), [pointer.type])
            asm = ir.InlineAsm(fnty, f"ld.global.nc.v4.{kind} {{$0,$1,$2,$3}}, [$4];",
                               f"={constraint},={constraint},={constraint},={constraint},l")
            result = builder.call(asm, [pointer])
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_value(result, k) for k in range(4)])

        return sig, codegen

    @functools.cache
    def shared_view(shape: tuple):
        """The device function view(flat, start): flat[start : start + prod(shape)] as a C array of `shape`."""
        shape = tuple(int(n) for n in shape)

        @intrinsic
        def view(typingctx, flat, start):
            if not isinstance(flat, types.Array) or flat.ndim != 1 or flat.layout != "C":
                raise TypeError(f"shared_view wants a 1-D C-contiguous array, got {flat}")
            if not isinstance(start, types.Integer):
                raise TypeError(f"shared_view wants an integer start, got {start}")
            result = types.Array(flat.dtype, len(shape), "C")
            sig = result(flat, start)

            def codegen(context, builder, signature, args):
                data = _element_pointer(context, builder, signature.args[0], args[0], signature.args[1:], args[1:])
                itemsize = context.get_abi_sizeof(context.get_data_type(signature.args[0].dtype))
                strides = [itemsize * int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
                array = context.make_array(signature.return_type)(context, builder)
                context.populate_array(array, data=data, shape=[context.get_constant(types.intp, n) for n in shape],
                                       strides=[context.get_constant(types.intp, n) for n in strides],
                                       itemsize=context.get_constant(types.intp, itemsize), meminfo=None)
                return array._getvalue()

            return sig, codegen

        return view

else:
    class _WarpMeeting:
        """Where the `size` simulated lanes of one warp (32) or warpgroup (128: wgmma.py) meet at a collective op.
        Each lane leaves its operands in `operands[phase][lane]` and waits until all have; then it may read
        everyone's. Two phases, each lane alternating: a lane can rewrite a phase's slots only after the next op's
        barrier, which every lane reaches after it has finished reading them. `results[phase]` caches what the
        first lane through computes for all of them (mma)."""

        def __init__(self, size: int = WARP):
            self.size = size
            self.condition = threading.Condition()
            self.arrived = 0
            self.generation = 0
            self.operands = [[None] * size, [None] * size]
            self.results = [None, None]
            self.phase = [0] * size

        def meet(self, lane: int, operands, thread):
            phase = self.phase[lane]
            self.phase[lane] ^= 1
            self.operands[phase][lane] = operands
            self.results[phase] = None
            with self.condition:
                generation = self.generation
                self.arrived += 1
                if self.arrived == self.size:
                    self.arrived = 0
                    self.generation += 1
                    self.condition.notify_all()
                while self.generation == generation:
                    self.condition.wait(timeout=0.5)
                    if getattr(thread, "abort", False):  # another thread of the block failed
                        raise RuntimeError("abandoned a warp-collective op: another thread of the block failed")
            return phase

    _meetings_lock = threading.Lock()

    def _meeting():
        """(this lane, its warp's meeting): the simulator's thread says which block and thread it is."""
        thread = threading.current_thread()
        manager = getattr(thread, "_manager", None)
        assert manager is not None, "a warp-collective op runs inside a kernel"
        block_threads = int(np.prod(manager._block_dim))
        assert block_threads % WARP == 0, f"warp-collective ops need whole warps: a block of {block_threads} threads"
        with _meetings_lock:
            meetings = manager.__dict__.setdefault("_warp_meetings", {})
            meeting = meetings.setdefault(thread.thread_id // WARP, _WarpMeeting())
        return thread.thread_id % WARP, meeting, thread

    def _bf16_halves(words):
        """uint32 words -> float64 (low bf16, high bf16)."""
        words = np.asarray(words, np.uint32)
        low = (words << np.uint32(16)).view(np.float32).astype(np.float64)
        high = (words & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
        return low, high

    def _mma_all_lanes(operands):
        """D's four values for each of the 32 lanes from their (a0..a3, b0, b1, c0..c3)."""
        ops = np.array([o[:6] for o in operands], np.uint32)  # [lane, register]
        c = np.array([o[6:] for o in operands], np.float64)
        g, t = np.arange(WARP) >> 2, np.arange(WARP) & 3
        A = np.empty((16, 16))
        B = np.empty((16, 8))
        for register, (row, col) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[row, col], A[row, col + 1] = _bf16_halves(ops[:, register])
        for register, k in ((4, 2 * t), (5, 2 * t + 8)):
            B[k, g], B[k + 1, g] = _bf16_halves(ops[:, register])
        D = A @ B
        d = np.stack([D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]], axis=1)
        return (c + d).astype(np.float32)

    def mma_bf16_m16n8k16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        lane, meeting, thread = _meeting()
        phase = meeting.meet(lane, (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), thread)
        with meeting.condition:
            if meeting.results[phase] is None:
                meeting.results[phase] = _mma_all_lanes(meeting.operands[phase])
            d = meeting.results[phase][lane]
        return d[0], d[1], d[2], d[3]

    def ldmatrix_x4(smem, s, r, c):
        lane, meeting, thread = _meeting()
        phase = meeting.meet(lane, (s, r, c), thread)
        rows = meeting.operands[phase]
        column = 2 * (lane % 4)
        registers = []
        for matrix in range(4):
            s_i, r_i, c_i = rows[8 * matrix + lane // 4]
            registers.append(pack_bf16x2(smem[s_i, r_i, c_i + column], smem[s_i, r_i, c_i + column + 1]))
        return registers[0], registers[1], registers[2], registers[3]

    def ldmatrix_x4_trans(smem, s, r, c):
        lane, meeting, thread = _meeting()
        phase = meeting.meet(lane, (s, r, c), thread)
        rows = meeting.operands[phase]
        column = lane // 4
        registers = []
        for matrix in range(4):  # this lane's column of each matrix, rows 2 (lane % 4) and + 1
            s_0, r_0, c_0 = rows[8 * matrix + 2 * (lane % 4)]
            s_1, r_1, c_1 = rows[8 * matrix + 2 * (lane % 4) + 1]
            registers.append(pack_bf16x2(smem[s_0, r_0, c_0 + column], smem[s_1, r_1, c_1 + column]))
        return registers[0], registers[1], registers[2], registers[3]

    def shfl_xor(value, lane_mask):
        lane, meeting, thread = _meeting()
        phase = meeting.meet(lane, value, thread)
        return meeting.operands[phase][lane ^ lane_mask]

    def _cp_async_groups():
        """This simulated thread's copies in flight: a list of committed groups, then the open one (a list of
        pending copies each)."""
        thread = threading.current_thread()
        if not hasattr(thread, "_cp_async_groups"):
            thread._cp_async_groups = [[]]
        return thread._cp_async_groups

    def _land(copy):
        smem, s, r, c, gmem, gr, gc, src_bytes = copy
        for e in range(8):
            smem[s, r, c + e] = gmem[gr, gc + e] if src_bytes else 0

    def cp_async_16(smem, s, r, c, gmem, gr, gc, src_bytes):
        _cp_async_groups()[-1].append((smem, s, r, c, gmem, gr, gc, src_bytes))

    def cp_async_commit():
        _cp_async_groups().append([])

    @functools.cache
    def cp_async_wait_group(n: int):
        assert n >= 0

        def wait():  # the copies land as late as the hardware may land them: when a wait covers their group
            groups = _cp_async_groups()
            committed = len(groups) - 1
            while committed > n:
                for copy in groups.pop(0):
                    _land(copy)
                committed -= 1

        return wait

    _F32_TINY = np.finfo(np.float32).tiny

    def pack_f32_bf16x2(lo, hi):
        return pack_bf16x2(f32_to_bf16(lo), f32_to_bf16(hi))

    def exp2_approx(x):  # exact 2^x rounded to float32, with the hardware's flush of results below 2^-126
        result = np.float32(np.exp2(np.float64(x)))
        return np.float32(0.0) if result < _F32_TINY else result

    def load_x4(array, i, j):
        return array[i, j], array[i, j + 1], array[i, j + 2], array[i, j + 3]

    @functools.cache
    def shared_view(shape: tuple):
        shape = tuple(int(n) for n in shape)
        size = int(np.prod(shape))

        def view(flat, start):  # (a short flat array fails the reshape: a launch with too little dynamic memory)
            return flat[start:start + size].reshape(shape)

        return view


cp_async_wait_all = cp_async_wait_group(0)


def mma_ref(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """numpy twin of one mma on whole tiles: a [16, 16] and b [16, 8] bf16 bits (uint16), c [16, 8] float32;
    D = C + A @ B in float64, rounded once to float32."""
    import ml_dtypes
    a64 = a.view(ml_dtypes.bfloat16).astype(np.float64)
    b64 = b.view(ml_dtypes.bfloat16).astype(np.float64)
    return (c.astype(np.float64) + a64 @ b64).astype(np.float32)
