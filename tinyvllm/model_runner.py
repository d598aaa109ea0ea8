"""The one forward pass of a Llama model, as a sequence of kernel launches that can be stepped.

`ModelRunner.forward_stages(batch)` is a generator: it launches the kernels of one stage, yields a
`Stage` (its name, the kernel that ran, its output device array), and goes on when asked for the next.
`generate`, `check-goldens` and the debugger all drive this same generator; `forward` just drains it.

Per layer (HF LlamaDecoderLayer):
    x = rmsnorm(h) ; q, k, v = rope(x Wq), rope(x Wk), x Wv ; a = attention(q, KV cache) ;
    h = h + a Wo ; x = rmsnorm(h) ; h = h + (silu(x Wg) * (x Wu)) Wd
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from kernels_numba.activation import residual_add, silu_mul
from kernels_numba.common import SIMULATOR, cuda
from kernels_numba.embedding import embedding, take_rows
from kernels_numba.matmul import linear, linear_kernel_name
from kernels_numba.paged_attention import (build_prefill_tiles, paged_attention_per_query,
                                           paged_attention_prefill, paged_attention_split_keys, write_kv_paged)
from kernels_numba.rmsnorm import rmsnorm
from kernels_numba.rope import rope

from .config import ModelConfig
from .kv_pool import KVPool


@dataclass
class LayerWeights:
    input_norm: object
    q_proj: object
    k_proj: object
    v_proj: object
    o_proj: object
    post_norm: object
    gate_proj: object
    up_proj: object
    down_proj: object


@dataclass
class DeviceWeights:
    """Every weight of the model on the device, as uint16 bf16 bit patterns, uploaded once."""
    embed_tokens: object
    layers: list[LayerWeights]
    norm: object
    lm_head: object

    @classmethod
    def upload(cls, config: ModelConfig, host: dict[str, np.ndarray],
               progress: Callable[[int, int], None] | None = None) -> "DeviceWeights":
        total = len(host)
        uploaded = {}
        for done, (name, array) in enumerate(host.items(), 1):
            uploaded[name] = cuda.to_device(np.ascontiguousarray(array))
            if progress:
                progress(done, total)

        def layer(i: int) -> LayerWeights:
            p = f"model.layers.{i}."
            return LayerWeights(
                input_norm=uploaded[p + "input_layernorm.weight"],
                q_proj=uploaded[p + "self_attn.q_proj.weight"],
                k_proj=uploaded[p + "self_attn.k_proj.weight"],
                v_proj=uploaded[p + "self_attn.v_proj.weight"],
                o_proj=uploaded[p + "self_attn.o_proj.weight"],
                post_norm=uploaded[p + "post_attention_layernorm.weight"],
                gate_proj=uploaded[p + "mlp.gate_proj.weight"],
                up_proj=uploaded[p + "mlp.up_proj.weight"],
                down_proj=uploaded[p + "mlp.down_proj.weight"],
            )

        embed = uploaded["model.embed_tokens.weight"]
        lm_head = embed if config.tie_word_embeddings else uploaded["lm_head.weight"]
        return cls(embed_tokens=embed, layers=[layer(i) for i in range(config.num_hidden_layers)],
                   norm=uploaded["model.norm.weight"], lm_head=lm_head)


@dataclass
class ForwardBatch:
    """What one forward step processes, built by the engine from the scheduler's decision.

    T tokens flattened across B sequences (decode tokens and prefill chunks mixed); K/V go to the paged
    pool through `slot_mapping`, attention reads them back through `block_tables`.
    """
    token_ids: np.ndarray     # int32 [T]
    positions: np.ndarray     # int32 [T], each token's position in its sequence
    query_seq: np.ndarray     # int32 [T], each token's sequence: a row of block_tables
    slot_mapping: np.ndarray  # int32 [T], where each token's K/V go in the pool
    block_tables: np.ndarray  # int32 [B, max_blocks], -1 padded
    logits_rows: np.ndarray   # int32 [R], which of the T tokens get logits (each sampling sequence's last)

    def __post_init__(self):
        for name in ("token_ids", "positions", "query_seq", "slot_mapping", "block_tables", "logits_rows"):
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=np.int32))
        n = len(self.token_ids)
        assert n > 0 and self.positions.shape == self.query_seq.shape == self.slot_mapping.shape == (n,)
        assert self.block_tables.ndim == 2 and 0 <= self.query_seq.min() and self.query_seq.max() < len(self.block_tables)
        assert len(self.logits_rows) == 0 or (self.logits_rows.min() >= 0 and self.logits_rows.max() < n)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_decode_only(self) -> bool:
        """One token per sequence (so attention needs no query tiles)."""
        return len(np.unique(self.query_seq)) == self.num_tokens


@dataclass
class Stage:
    """One step of the forward pass: what ran and what it produced (a device array)."""
    name: str              # e.g. "layers.3.q", see docs/architecture.md
    kernel: str            # the launcher that produced it, e.g. "matmul.gemv + rope.rope"
    output: object         # device array
    layer: int | None = None
    seconds: float = 0.0   # host wall time of the launches (synchronised)

    def to_host(self) -> np.ndarray:
        return self.output.copy_to_host()


@dataclass
class ModelRunner:
    """Owns the device side of one model: its weights, its paged KV pool and the RoPE frequencies."""
    config: ModelConfig
    weights: DeviceWeights
    kv_pool: KVPool
    inv_freq: np.ndarray  # float32 [head_dim / 2], from kernels_numba.rope.rope_inv_freq

    def __post_init__(self):
        self.inv_freq = cuda.to_device(self.inv_freq)
        self.attention_scale = np.float32(self.config.head_dim ** -0.5)

    def forward(self, batch: ForwardBatch):
        """Run the whole forward pass; return the logits device array [len(logits_rows), vocab]."""
        stages = self.forward_stages(batch, synchronize=False)
        while True:
            try:
                next(stages)
            except StopIteration as done:
                return done.value

    def forward_stages(self, batch: ForwardBatch, all_logits: bool = False,
                       synchronize: bool = True) -> Iterator[Stage]:
        """Yield each stage in order; the generator's return value is the logits device array.

        With `all_logits`, logits are computed for every token (golden checks), else only for
        `batch.logits_rows` (and not at all, returning None, when there are none). With `synchronize`,
        each stage waits for its kernels, so its output is ready and `seconds` is its real time; without,
        launches stay asynchronous (the engine's plain step) and `seconds` is only the launch time.
        """
        c, w_all = self.config, self.weights
        T, nh, nkv, hd = batch.num_tokens, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        eps = c.rms_norm_eps
        token_ids = cuda.to_device(batch.token_ids)
        positions = cuda.to_device(batch.positions)
        query_seq = cuda.to_device(batch.query_seq)
        slot_mapping = cuda.to_device(batch.slot_mapping)
        block_tables = cuda.to_device(batch.block_tables)
        attend, attention_kernel = self._attention_for(batch, block_tables, query_seq, positions)

        def _stage(name, kernel, launch, layer=None):
            return _run_stage(name, kernel, launch, layer, synchronize)

        def matmul(in_features: int, rows: int = T) -> str:  # which kernel `linear` runs, for the record
            return "matmul." + linear_kernel_name(rows, in_features)
        H, I = c.hidden_size, c.intermediate_size

        h = yield from _stage("embedding", "embedding.embedding", lambda: embedding(token_ids, w_all.embed_tokens))
        for i, w in enumerate(w_all.layers):
            k_pool, v_pool = self.kv_pool.layer(i)
            name = f"layers.{i}.".__add__
            x = yield from _stage(name("input_norm"), "rmsnorm.rmsnorm", lambda: rmsnorm(h, w.input_norm, eps), i)
            q = yield from _stage(name("q"), matmul(H) + " + rope.rope", lambda: rope(
                linear(x, w.q_proj).reshape(T, nh, hd), positions, self.inv_freq), i)
            k = yield from _stage(name("k"), matmul(H) + " + rope.rope", lambda: rope(
                linear(x, w.k_proj).reshape(T, nkv, hd), positions, self.inv_freq), i)
            v = yield from _stage(name("v"), matmul(H), lambda: linear(x, w.v_proj).reshape(T, nkv, hd), i)

            def attention_stage():
                write_kv_paged(k, v, k_pool, v_pool, slot_mapping)
                return attend(q, k_pool, v_pool).reshape(T, nh * hd)
            a = yield from _stage(name("attn"), "paged_attention.write_kv_paged + " + attention_kernel,
                                  attention_stage, i)
            o = yield from _stage(name("o_proj"), matmul(nh * hd), lambda: linear(a, w.o_proj), i)
            h = yield from _stage(name("attn_residual"), "activation.residual_add", lambda: residual_add(o, h), i)
            x = yield from _stage(name("post_norm"), "rmsnorm.rmsnorm", lambda: rmsnorm(h, w.post_norm, eps), i)
            m = yield from _stage(name("mlp"), f"{matmul(H)} x2 + activation.silu_mul + {matmul(I)}", lambda: linear(
                silu_mul(linear(x, w.gate_proj), linear(x, w.up_proj)), w.down_proj), i)
            h = yield from _stage(name("output"), "activation.residual_add", lambda: residual_add(m, h), i)
        x = yield from _stage("final_norm", "rmsnorm.rmsnorm", lambda: rmsnorm(h, w_all.norm, eps))
        if not all_logits:
            if len(batch.logits_rows) == 0:  # a step of prefill chunks that end mid-prompt samples nothing
                return None
            x = take_rows(x, cuda.to_device(batch.logits_rows))
        logits = yield from _stage("logits", matmul(H, rows=x.shape[0]), lambda: linear(x, w_all.lm_head))
        return logits

    def _attention_for(self, batch: ForwardBatch, block_tables, query_seq, positions):
        """Pick the attention kernel for this step: (q, k_pool, v_pool) -> out, and its name.

        In the simulator (where syncthreads are slow) one thread per (query, head) serves every step. On a
        GPU, decode-only steps give each (query, head) a block whose threads split the keys, and steps with
        prefill chunks use the kernel that walks key tiles through shared memory; its query tiles are built
        once for all layers.
        """
        scale = self.attention_scale
        if SIMULATOR:
            def per_query(q, k_pool, v_pool):
                return paged_attention_per_query(q, k_pool, v_pool, block_tables, query_seq, positions, scale)
            return per_query, "paged_attention.paged_attention_per_query"
        if batch.is_decode_only:
            def split_keys(q, k_pool, v_pool):
                return paged_attention_split_keys(q, k_pool, v_pool, block_tables, query_seq, positions, scale)
            return split_keys, "paged_attention.paged_attention_split_keys"
        tiles = build_prefill_tiles(batch.query_seq, batch.positions)

        def tiled(q, k_pool, v_pool):
            return paged_attention_prefill(q, k_pool, v_pool, block_tables, query_seq, positions, scale, tiles=tiles)
        return tiled, "paged_attention.paged_attention_prefill"


def _run_stage(name: str, kernel: str, launch: Callable[[], object], layer: int | None = None,
               synchronize: bool = True):
    """Run one stage's launches (and wait for them), yield the Stage, hand its output back to the caller."""
    start = time.perf_counter()
    output = launch()
    if synchronize:
        cuda.synchronize()
    yield Stage(name, kernel, output, layer, time.perf_counter() - start)
    return output
