"""Lesson: the tensor-core prefill attention with every refinement off. Production:
kernels_numba/attention/prefill_tc.py (`paged_attention_prefill_tc` under TC_OPTIONS); this is the same kernel
compiled with ORIGINAL_OPTIONS, the first version, kept to time and test side by side with it.

    paged_attention_prefill_tc(..., options=ORIGINAL_OPTIONS)

What it does differently, one TcOptions field each (prefill_tc's module docstring says why each refinement is
faster; the measured times: docs/bench-h200.md):
- pipelined=False: each key tile is loaded, waited for and then computed on, in one shared stage; the block idles
  through every load, and a second syncthreads a tile keeps the next load off the stage still being read.
- exp2=False: q is scaled by `scale` only, and every softmax weight and rescale factor is libdevice's expf
  (prefill_tc.exp_f32: several instructions around one ex2 to reach 1 ulp) instead of one ex2.approx on a score
  already in base 2. The output differs from the production kernel's by about as much as either differs from
  float32 attention (a different bf16 rounding of q), within the same error bound.
- cvt_pack=False: each of P's weights is rounded to bf16 by f32_to_bf16's integer ops, then shifted and or-ed into
  a pair (prefill_tc.pack_rounded): the same bits as one cvt.rn.bf16x2.f32.
- mask_diagonal_only=False: the causal mask's compares run in every key tile, not only in the tiles that reach
  past one of a lane's rows.
- heaviest_first=False: block i takes tile i, so a prompt's longest tiles (its last queries) start last.
"""
from kernels_numba.attention.prefill_tc import TcOptions

ORIGINAL_OPTIONS = TcOptions(pipelined=False, exp2=False, cvt_pack=False, mask_diagonal_only=False,
                             heaviest_first=False)
