"""Steps with prefill chunks replayed from CUDA graphs: one graph per token-count bucket, embedding to final_norm.

From Python a prefill step is host-bound: ~330 launches of 0.15-0.3 ms each for a few ms of GPU work (Llama-3.2-1B,
128 tokens). cuda_graphs.py replays decode steps; this does the same for every other step (prompts, chunks, prompts
mixed with decodes), with what that takes beyond the decode recipe:
- token buckets: a step of T tokens runs in the graph of the smallest bucket >= T (`prefill_buckets_up_to`, up to
  max_num_batched_tokens); the rows past T are padding: token 0 at position 0, slot -1 (no KV write), in the
  block table of a dummy sequence (row max_num_seqs, block 0) and in no attention tile;
- fixed attention grid: the query tiles (kernels_numba/attention/prefill.py) sit in static buffers too, padded to
  the most tiles a bucket can need (max_prefill_tiles) with empty tiles, which the prefill kernels skip;
- logits in a second graph: the step's graph ends at final_norm; how many rows want logits varies per step, so the
  LM head and the rows' argmax run in a small graph per row count (CapturedLogits, up to LOGITS_GRAPH_ROWS rows:
  a prompt's first token is one), replayed right after it, reading the rows from the step's static inputs; the
  same launches as the eager path's (ForwardPass.logits), which serves steps with more rows;
- memory: a bucket's activations are large (gate|up alone is T x 2 intermediate floats), so the graphs' buffers
  come from common.LayerArena (layer i writes set i % 2: two layers' worth, not all of them) over one
  SharedStorage for every bucket (they replay one after another on one stream): the largest bucket's activations
  once, `activation_bytes_per_token` a token (the engine leaves that much GPU memory beside the KV pool).
Steps that want logits for every token (golden checks) and steps past the largest bucket run eagerly, as do
step_stages (the debugger, check-goldens: their stage outputs must stay distinct arrays). In the simulator there
are no graphs: a "replay" re-runs the recorded forward over the same buffers.
"""
from __future__ import annotations

import numpy as np

from kernels_numba.attention import PrefillTiles, max_prefill_tiles, prefill_tiles_host
from kernels_numba.common import SharedStorage, LayerArena, cuda
from kernels_numba.sampling import argmax

from tinyvllm.model.config import ModelConfig
from tinyvllm.runner.cuda_graphs import BucketGraphs, CapturedStep, buckets_up_to
from tinyvllm.runner.forward import ForwardPass
from tinyvllm.runner.inputs import DeviceBatch, ForwardBatch, pack_int32, unpack
from tinyvllm.runner.stages import drain

# In fp32 a GPU step of up to 32 tokens (MAX_COALESCED_TOKENS) runs the fused-GEMV layer, beyond it gemm_blocked: the
# buckets 16 and 32 keep short prompts on the kernels their eager step runs (the same results), 64 and up the others.
# (The fast plan leaves the GEMVs past kernel_plan.FAST_GEMV_MAX_TOKENS: there only a 1- or 2-token step's eager
# kernels differ from its bucket's.)
LOGITS_GRAPH_ROWS = 8  # steps with at most this many logits rows take them from a CapturedLogits
PREFILL_BUCKETS = (16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)


def prefill_buckets_up_to(max_tokens: int) -> tuple[int, ...]:
    """The token buckets of an engine whose steps hold at most max_tokens tokens (the last bucket)."""
    return buckets_up_to(max_tokens, PREFILL_BUCKETS)


def activation_bytes_per_token(config: ModelConfig) -> int:
    """GPU memory of the prefill graphs' activations, per token of the largest bucket: two layers' outputs
    (LayerArena's sets), each float32 x (hidden 7, q 3, kv 4, intermediate 2 per token: x, q|k|v, q, k, v, the
    attention, o_proj, h and x twice, gate|up, down_proj) plus the fast precision's bf16 copies (hidden 2, q 1,
    intermediate 1). An upper bound for either precision (fp32 has no bf16 copies; where the fast plan computes the
    gate inside gate|up's GEMM, KernelPlan.fuses_swiglu, it writes no float32 gate|up: 16 I bytes a token less); the
    small buckets' split-K partials (gemm_blocked) are per step, not per token, and fit in what the largest bucket
    leaves."""
    c = config
    H, Q, KV, I = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, \
        c.intermediate_size
    return 2 * (4 * (7 * H + 3 * Q + 4 * KV + 2 * I) + 2 * (2 * H + Q + I))


class CapturedLogits(CapturedStep):
    """The LM head over `rows` (a device int32 view of a captured prefill's static inputs) of `hidden` (its output)
    and their argmax, recorded (and, on a GPU, captured as a CUDA graph) over buffers from `storage`."""

    def __init__(self, forward: ForwardPass, hidden, rows, storage: SharedStorage):
        self.forward, self.hidden, self.rows = forward, hidden, rows
        self.greedy_ids = cuda.to_device(np.zeros(rows.shape[0], np.int32))
        self._record(LayerArena(storage))
        self.logits = self.output

    def _launch(self):
        logits = self.forward.logits(self.hidden, self.rows)
        argmax(logits, out=self.greedy_ids)
        return logits


class CapturedPrefill(CapturedStep):
    """The forward pass from embedding to final_norm for exactly `bucket` tokens of at most max_seqs sequences,
    over static input buffers and buffers from `storage`, recorded (and, on a GPU, captured as a CUDA graph); then
    its logits graphs (CapturedLogits), one per count of logits rows, over buffers from `logits_storage`: the one-row
    graph now, the others at first use."""

    def __init__(self, forward: ForwardPass, bucket: int, max_seqs: int, max_blocks_per_seq: int,
                 storage: SharedStorage, logits_storage: SharedStorage):
        self.forward, self.bucket, self.max_seqs, self.width = forward, bucket, max_seqs, max_blocks_per_seq
        self.tile_queries = forward.plan.prefill_tile_queries()
        self.num_tiles = 0 if self.tile_queries is None else max_prefill_tiles(bucket, max_seqs, self.tile_queries)
        dummy = self._inputs(ForwardBatch([0], [0], [0], [-1], np.zeros((1, 1), np.int32), [0]))
        self._host = cuda.pinned_array(sum(a.size for a in dummy), np.int32)
        _, layout = pack_int32(dummy, out=self._host)
        self._device = cuda.to_device(self._host)
        views = unpack(self._device, layout)
        tiles = None if self.tile_queries is None else PrefillTiles(*views[6:], self.num_tiles)
        self._batch = DeviceBatch(*views[:5], decode_only=False, prefill_tiles=tiles)
        self._logits_rows = views[5]
        self._record(LayerArena(storage))
        self._logits_storage = logits_storage
        self._logits: dict[int, CapturedLogits] = {}
        self._logits_step(1)

    def _logits_step(self, count: int) -> CapturedLogits:
        """The logits graph of `count` rows (recorded at first use)."""
        if count not in self._logits:
            self._logits[count] = CapturedLogits(self.forward, self.output, self._logits_rows[:count],
                                                 self._logits_storage)
        return self._logits[count]

    def _launch(self):
        return drain(self.forward.device_hidden_stages(self._batch, synchronize=False))

    def _inputs(self, batch: ForwardBatch) -> list[np.ndarray]:
        """The batch's arrays padded to the bucket (see the module docstring) and its query tiles to num_tiles."""
        Tb, S, W, T = self.bucket, self.max_seqs, self.width, batch.num_tokens
        B, width = batch.block_tables.shape
        assert T <= Tb and B <= S and width <= W, (T, Tb, B, S, width, W)
        token_ids = np.zeros(Tb, np.int32)
        positions = np.zeros(Tb, np.int32)
        query_seq = np.full(Tb, S, np.int32)  # the dummy sequence's row
        slots = np.full(Tb, -1, np.int32)
        token_ids[:T], positions[:T], query_seq[:T] = batch.token_ids, batch.positions, batch.query_seq
        slots[:T] = batch.slot_mapping
        tables = np.full((S + 1, W), -1, np.int32)
        tables[:B, :width] = batch.block_tables
        tables[S, 0] = 0
        rows = self._rows_wanting_logits(batch)
        logits_rows = np.zeros(LOGITS_GRAPH_ROWS, np.int32)
        if len(rows) <= LOGITS_GRAPH_ROWS:
            logits_rows[:len(rows)] = rows
        arrays = [token_ids, positions, query_seq, slots, tables, logits_rows]
        if self.tile_queries is not None:
            arrays += prefill_tiles_host(batch.query_seq, batch.positions, self.tile_queries, self.num_tiles)
        return arrays

    @staticmethod
    def _rows_wanting_logits(batch: ForwardBatch) -> np.ndarray:
        return np.arange(batch.num_tokens) if batch.samples_every_token else np.asarray(batch.logits_rows)

    def run(self, batch: ForwardBatch) -> tuple:
        """Run the step for `batch`: device arrays of the logits of its logits rows and of their argmax (valid until
        the next step with prefill chunks: every bucket's logits graphs share their buffers; None: not computed, with
        more than LOGITS_GRAPH_ROWS rows, where the LM head runs eagerly into a fresh array), or (None, None) when no
        row wants logits."""
        pack_int32(self._inputs(batch), out=self._host)
        self._device.copy_to_device(self._host)
        self._replay()
        count = len(self._rows_wanting_logits(batch))
        if count == 0:
            return None, None
        if count <= LOGITS_GRAPH_ROWS:
            step = self._logits_step(count)
            step._replay()
            return step.logits, step.greedy_ids
        rows = None if batch.samples_every_token else cuda.to_device(np.asarray(batch.logits_rows, np.int32))
        return self.forward.logits(self.output[:batch.num_tokens], rows), None


class PrefillGraphs(BucketGraphs):
    """The captured steps with prefill chunks of one engine, one per token bucket, captured on first use; their
    activations share one SharedStorage."""

    def __init__(self, forward: ForwardPass, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, log=None,
                 buckets: tuple[int, ...] | None = None):
        super().__init__(buckets or prefill_buckets_up_to(max_tokens), log)
        self.forward, self.max_seqs, self.max_blocks_per_seq = forward, max_seqs, max_blocks_per_seq
        self.storage = SharedStorage()
        self.logits_storage = SharedStorage()  # every bucket's logits graphs (run one at a time, as the steps)

    def can_run(self, batch: ForwardBatch) -> bool:
        """Not decode-only (those are DecodeGraphs'), a bucket holds its tokens, its sequences and their blocks."""
        return (not batch.is_decode_only and batch.num_tokens <= self.buckets[-1]
                and batch.block_tables.shape[0] <= self.max_seqs
                and batch.block_tables.shape[1] <= self.max_blocks_per_seq)

    def run(self, batch: ForwardBatch):
        return self._capture(self.bucket_for(batch.num_tokens)).run(batch)

    def _make(self, bucket: int) -> CapturedPrefill:
        return CapturedPrefill(self.forward, bucket, self.max_seqs, self.max_blocks_per_seq, self.storage,
                               self.logits_storage)

    def _describe(self, bucket: int, step: CapturedPrefill) -> str:
        return (f"prefill step for {bucket} tokens (activations of every prefill graph: "
                f"{self.storage.bytes / 2**20:.1f} MiB)")
