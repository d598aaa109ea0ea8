import math

import numpy as np
import pytest

from kernels_numba.common import cuda
from kernels_numba.kv_dtype import kv_encode_ref
from kernels_numba.rope import rope, rope_inv_freq, rope_qkv, rope_qkv_ref, rope_ref
from tests.helpers import poisoned
from tests.references import require

# Llama-3.2-1B's rope_scaling (its head_dim is 64, theta 500000); with head_dim 16 instead the
# wavelengths fall in all three bands.
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def _llama3_float64(head_dim, theta, s):
    """The llama3 rule written per frequency, in float64, from Meta's reference description."""
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(freq)
        elif wavelen > low_wavelen:
            out.append(freq / s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"])
            out.append((1 - smooth) * freq / s["factor"] + smooth * freq)
    return np.array(out), np.array([2 * math.pi * theta ** (i / head_dim) for i in range(0, head_dim, 2)])


# Independent float64 formulas vs the float32 step-by-step port: each float32 op rounds (pow, divide,
# smoothing: ~6 ops), so 1e-6 relative (~8 ulp) is enough and far tighter than any formula mistake.
@pytest.mark.parametrize("head_dim, theta", [(16, 500000.0), (64, 500000.0)])
def test_llama3_inv_freq_matches_float64_formula(head_dim, theta):
    want, wavelen = _llama3_float64(head_dim, theta, LLAMA3)
    if head_dim == 16:  # the case is only meaningful if every band is exercised
        assert (wavelen < 2048).any() and ((wavelen >= 2048) & (wavelen <= 8192)).any() and (wavelen > 8192).any()
    got = rope_inv_freq(head_dim, theta, LLAMA3)
    assert got.dtype == np.float32 and got.shape == (head_dim // 2,)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("theta", [10000.0, 100000.0])
@pytest.mark.parametrize("scaling", [None, {"rope_type": "default"}, {"rope_type": "linear", "factor": 4.0}])
def test_default_and_linear_inv_freq_match_float64_formula(theta, scaling):
    head_dim = 18
    factor = scaling["factor"] if scaling and "factor" in scaling else 1.0
    want = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim) / factor
    np.testing.assert_allclose(rope_inv_freq(head_dim, theta, scaling), want, rtol=1e-6)


def test_type_is_an_alias_of_rope_type():
    old_style = {"type": "linear", "factor": 2.0}
    np.testing.assert_array_equal(rope_inv_freq(16, 10000.0, old_style),
                                  rope_inv_freq(16, 10000.0, {"rope_type": "linear", "factor": 2.0}))


def test_unsupported_rope_type_is_named():
    with pytest.raises(ValueError, match=r"'yarn'.*default, linear, llama3"):
        rope_inv_freq(16, 10000.0, {"rope_type": "yarn", "factor": 2.0})


def test_llama3_missing_key_is_named():
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        rope_inv_freq(16, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0})


@pytest.mark.parametrize("head_dim, theta, scaling", [
    (16, 500000.0, LLAMA3), (64, 500000.0, LLAMA3), (64, 10000.0, None), (128, 100000.0, None),
    (64, 10000.0, {"rope_type": "linear", "factor": 4.0})])
def test_inv_freq_bit_exact_against_transformers(head_dim, theta, scaling):
    require("torch")
    require("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_theta": theta, **(scaling or {"rope_type": "default"})}
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=131072, rope_parameters=params)
    rope_type = params["rope_type"]
    init = (LlamaRotaryEmbedding.compute_default_rope_parameters if rope_type == "default"
            else ROPE_INIT_FUNCTIONS[rope_type])
    want, attention_scaling = init(config)
    assert attention_scaling == 1.0
    # same float32 operations in the same order: the bits must agree
    np.testing.assert_array_equal(rope_inv_freq(head_dim, theta, scaling).view(np.uint32),
                                  want.numpy().view(np.uint32))


def _rope_inputs(rng, n_heads=3, head_dim=18):
    x = rng.standard_normal((5, n_heads, head_dim)).astype(np.float32)
    positions = np.array([0, 1, 17, 2047, 4093], dtype=np.int32)
    return x, positions, rope_inv_freq(head_dim, 500000.0, LLAMA3)


# The angle is one float32 multiply on both sides (identical); cos/sin may differ by an ulp or two
# (~2.4e-7 absolute), so |out| error <= (|x1| + |x2|) * 2.4e-7 + rounding: 1e-5 with |x| < ~5.
TOL = dict(rtol=1e-5, atol=1e-5)


def test_rope_matches_ref_out_of_place(rng):
    x, positions, inv_freq = _rope_inputs(rng)
    d_x = cuda.to_device(x)
    out = poisoned(x.shape, np.float32)
    got = rope(d_x, cuda.to_device(positions), cuda.to_device(inv_freq), out=out).copy_to_host()
    np.testing.assert_allclose(got, rope_ref(x, positions, inv_freq), **TOL)
    np.testing.assert_array_equal(got[0], x[0])  # position 0: cos 1, sin 0 -> unchanged
    np.testing.assert_array_equal(d_x.copy_to_host(), x)  # input untouched


def test_rope_in_place(rng):
    x, positions, inv_freq = _rope_inputs(rng, n_heads=2, head_dim=8)
    d_x = cuda.to_device(x)
    returned = rope(d_x, cuda.to_device(positions), cuda.to_device(inv_freq), out=d_x)
    assert returned is d_x
    np.testing.assert_allclose(d_x.copy_to_host(), rope_ref(x, positions, inv_freq), **TOL)


def test_rope_ref_matches_transformers(rng):
    torch = require("torch")
    require("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    x, positions, inv_freq = _rope_inputs(rng)
    freqs = torch.from_numpy(positions).float()[:, None] * torch.from_numpy(inv_freq)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    q = torch.from_numpy(x).transpose(0, 1)[None]  # HF layout [batch, heads, T, hd]
    want, _ = apply_rotary_pos_emb(q, q, emb.cos()[None], emb.sin()[None])
    # both float32 with cos/sin from different libms: same bound as TOL
    np.testing.assert_allclose(rope_ref(x, positions, inv_freq), want[0].transpose(0, 1).numpy(), **TOL)


# GQA (4 q heads share 2 kv heads) and MHA; head_dim 16 with llama3 scaling puts the frequencies in all bands.
@pytest.mark.parametrize("n_heads, n_kv_heads, head_dim", [(4, 2, 16), (3, 3, 8), (2, 1, 18)])
def test_rope_qkv_matches_ref_and_unfused_rope_bit_for_bit(rng, n_heads, n_kv_heads, head_dim):
    n_tokens = 5
    qkv = rng.standard_normal((n_tokens, (n_heads + 2 * n_kv_heads) * head_dim)).astype(np.float32)
    assert (qkv != 0).all()
    positions = np.array([4093, 17, 2047, 3, 300], dtype=np.int32)  # not sorted, no 0
    inv_freq = rope_inv_freq(head_dim, 500000.0, LLAMA3)
    d_qkv, d_positions, d_inv_freq = cuda.to_device(qkv), cuda.to_device(positions), cuda.to_device(inv_freq)
    q_shape, kv_shape = (n_tokens, n_heads, head_dim), (n_tokens, n_kv_heads, head_dim)
    outs = poisoned(q_shape, np.float32), poisoned(kv_shape, np.float32), poisoned(kv_shape, np.float32)
    returned = rope_qkv(d_qkv, d_positions, d_inv_freq, n_heads, n_kv_heads, head_dim, *outs)
    assert all(got is want for got, want in zip(returned, outs))
    q, k, v = (a.copy_to_host() for a in returned)

    want_q, want_k, want_v = rope_qkv_ref(qkv, positions, inv_freq, n_heads, n_kv_heads, head_dim)
    np.testing.assert_allclose(q, want_q, **TOL)
    np.testing.assert_allclose(k, want_k, **TOL)
    np.testing.assert_array_equal(v, want_v)

    # rope() on the separately projected q and k (contiguous copies of the slices): every bit the same
    q_cols, k_cols = n_heads * head_dim, n_kv_heads * head_dim
    q_part = np.ascontiguousarray(qkv[:, :q_cols]).reshape(q_shape)
    k_part = np.ascontiguousarray(qkv[:, q_cols:q_cols + k_cols]).reshape(kv_shape)
    unfused_q = rope(cuda.to_device(q_part), d_positions, d_inv_freq, out=poisoned(q_shape, np.float32))
    unfused_k = rope(cuda.to_device(k_part), d_positions, d_inv_freq, out=poisoned(kv_shape, np.float32))
    np.testing.assert_array_equal(q.view(np.uint32), unfused_q.copy_to_host().view(np.uint32))
    np.testing.assert_array_equal(k.view(np.uint32), unfused_k.copy_to_host().view(np.uint32))
    np.testing.assert_array_equal(v.view(np.uint32), qkv[:, q_cols + k_cols:].reshape(kv_shape).view(np.uint32))
    np.testing.assert_array_equal(d_qkv.copy_to_host(), qkv)  # input untouched


def test_rope_qkv_allocates_its_outputs(rng):
    qkv = rng.standard_normal((2, (2 + 2 * 1) * 8)).astype(np.float32)
    positions = np.array([9, 4], dtype=np.int32)
    inv_freq = rope_inv_freq(8, 10000.0, None)
    q, k, v = rope_qkv(cuda.to_device(qkv), cuda.to_device(positions), cuda.to_device(inv_freq), 2, 1, 8)
    assert (q.shape, k.shape, v.shape) == ((2, 2, 8), (2, 1, 8), (2, 1, 8))
    for got, want in zip((q, k, v), rope_qkv_ref(qkv, positions, inv_freq, 2, 1, 8)):
        np.testing.assert_allclose(got.copy_to_host(), want, **TOL)


@pytest.mark.parametrize("kv_dtype", [np.float32, np.uint16])
def test_rope_qkv_stores_k_and_v_into_the_paged_pools(rng, kv_dtype):
    """With the pools: k and v land at each token's slot exactly as write_kv_paged_ref puts them (bit for bit:
    the same values rope_qkv returns, or in a bf16 pool (uint16) exactly their round-to-nearest-even bf16 bits),
    padding slots (-1) write nothing, every other pool entry keeps its value."""
    from kernels_numba.attention import write_kv_paged_ref
    n_heads, n_kv_heads, head_dim, block_size, num_blocks = 4, 2, 8, 4, 5
    n_tokens = 6
    qkv = rng.standard_normal((n_tokens, (n_heads + 2 * n_kv_heads) * head_dim)).astype(np.float32)
    positions = np.array([3, 11, 0, 7, 2, 5], dtype=np.int32)
    slots = np.array([13, 2, -1, 19, 7, 0], dtype=np.int32)  # scattered over blocks; one padding token
    inv_freq = rope_inv_freq(head_dim, 10000.0, None)
    pool_shape = (num_blocks, block_size, n_kv_heads, head_dim)
    k_pool = kv_encode_ref(rng.standard_normal(pool_shape), kv_dtype)
    v_pool = kv_encode_ref(rng.standard_normal(pool_shape), kv_dtype)
    d_k_pool, d_v_pool = cuda.to_device(k_pool), cuda.to_device(v_pool)
    q, k, v = rope_qkv(cuda.to_device(qkv), cuda.to_device(positions), cuda.to_device(inv_freq), n_heads,
                       n_kv_heads, head_dim, kv_pools=(d_k_pool, d_v_pool), slot_mapping=cuda.to_device(slots))
    k, v = k.copy_to_host(), v.copy_to_host()
    want_k_pool, want_v_pool = write_kv_paged_ref(k, v, k_pool, v_pool, slots)
    np.testing.assert_array_equal(d_k_pool.copy_to_host(), want_k_pool)
    np.testing.assert_array_equal(d_v_pool.copy_to_host(), want_v_pool)
    for got, want in zip((q.copy_to_host(), k, v), rope_qkv_ref(qkv, positions, inv_freq, n_heads, n_kv_heads,
                                                                head_dim)):
        np.testing.assert_allclose(got, want, **TOL)
