"""Decode steps replayed from CUDA graphs: one graph per batch-size bucket, captured once, replayed each step.

A decode step is ~10 kernel launches per layer; from Python each launch costs tens of microseconds of
argument marshalling, more than the kernels themselves at small batch. A CUDA graph records the whole
step once and replays it with one launch. What a graph bakes in (vLLM's and nano-vllm's recipe):
- every address: the step reads its token ids, positions, slot mapping and block tables from static
  device buffers (refilled by one host-to-device copy per step) and writes every intermediate into
  buffers recorded once (common.BufferArena);
- every launch configuration: a batch of B decodes runs in the graph of the smallest bucket >= B, the
  extra rows padded with a dummy query (token 0 at position 0, reading block 0, writing no KV: slot -1)
  whose logits nobody reads; block tables are padded to the model's longest context.
This module replays decode-only steps; prefill_graphs.py the others (token buckets, padded query tiles).

Pipelining (`launch`): at batch 1 the GPU runs a decode step in ~1.7 ms and the host spends ~0.5 ms between
steps (reading the token back, stop rules, scheduling, packing the next inputs); waiting for each other, the
two add up. For an all-greedy step the next step's inputs do not depend on the token's value, only on where
it goes: the runner launches step n + 1 before it reads step n's tokens (runner/step.py), with token id
FED_BACK in every row, and the graph's embedding takes those rows' ids from this bucket's argmax buffer, which
step n wrote (same bucket, same rows, same order: LLMEngine._can_follow checks). The host copies are stream-ordered and asynchronous, from
two pinned buffers used in turn, so step n + 1's inputs never overwrite step n's while it runs.

In the simulator there are no graphs: a "replay" runs the same recorded forward again with the same
buffers, so the simulator tests exercise everything here except the capture itself.
"""
from __future__ import annotations

import time

import numpy as np

from kernels_numba.attention import PrefillTiles, prefill_tiles_host
from kernels_numba.common import SIMULATOR, BufferArena, cuda, launching_into
from kernels_numba.sampling import argmax

from tinyvllm.runner.forward import ForwardPass
from tinyvllm.runner.inputs import DeviceBatch, ForwardBatch, pack_int32, unpack

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def graphs_enabled(cuda_graphs: bool | None, prefill_graphs: bool | None) -> tuple[bool, bool]:
    """Whether decode steps and steps with prefill chunks replay CUDA graphs: as set, or (None) on a GPU only
    for decode steps; prefill graphs as decode graphs unless set."""
    decode = (not SIMULATOR) if cuda_graphs is None else cuda_graphs
    return decode, decode if prefill_graphs is None else prefill_graphs


def buckets_up_to(limit: int, sizes: tuple[int, ...] = BUCKETS) -> tuple[int, ...]:
    """The buckets of `sizes` below `limit`, then `limit` itself (the largest step always has its own)."""
    return tuple(b for b in sizes if b < limit) + (limit,)


class CapturedStep:
    """A forward step over static input buffers: recorded once (every output buffer from `arena`), then, on a GPU,
    captured as a CUDA graph and replayed; in the simulator re-run over the same buffers. Subclasses say what one
    pass launches (`_launch`, returning the step's output device array)."""

    def _record(self, arena: BufferArena) -> None:
        self._arena = arena
        self.output = self._forward(0)  # eager: compiles every kernel, records every buffer
        cuda.synchronize()
        self._graph = None if SIMULATOR else self._capture()

    def _launch(self):
        raise NotImplementedError

    def _forward(self, stream):
        """One pass launched on `stream`, its outputs from the arena (recorded the first time, the same after)."""
        recorded = bool(self._arena.buffers)
        if recorded:
            self._arena.rewind()
        with cuda.defer_cleanup(), launching_into(stream, self._arena):
            output = self._launch()
        assert not recorded or output is self.output, "the step wrote its output somewhere else"
        return output

    def _capture(self):
        from cuda.core import Device, Stream
        Device().set_current()
        self._stream = Stream.from_handle(0)  # the legacy default stream: ordered with every other launch
        builder = Device().create_graph_builder()
        builder.begin_building()
        self._forward(builder)
        return builder.end_building().complete()

    def _replay(self) -> None:
        """The recorded pass again, over whatever the static inputs hold now."""
        if self._graph is not None:
            self._graph.launch(self._stream)
        else:
            self._forward(0)


class CapturedDecode(CapturedStep):
    """The decode step for exactly `bucket` rows, over static input buffers, recorded (and, on a GPU,
    captured as a CUDA graph)."""

    def __init__(self, forward: ForwardPass, bucket: int, max_blocks_per_seq: int):
        self.forward, self.bucket, self.width = forward, bucket, max_blocks_per_seq
        B, W = bucket, max_blocks_per_seq
        # where decode-only steps run the prefill attention (KernelPlan.tiled_decode): a query tile per row
        self.tile_queries = forward.plan.prefill_tile_queries() if forward.plan.tiled_decode else None
        dummy = self._inputs(ForwardBatch([0], [0], [0], [-1], np.zeros((1, 1), np.int32), [0]))
        size = sum(a.size for a in dummy)
        # two pinned input buffers and two for the tokens read back, used in turn by pipelined launches
        self._hosts = [cuda.pinned_array(size, np.int32) for _ in range(2)]
        self._tokens_host = [cuda.pinned_array(B, np.int32) for _ in range(2)]
        self._done = [cuda.event() if SIMULATOR else cuda.event(timing=False) for _ in range(2)]
        self._turn = 0
        _, layout = pack_int32(dummy, out=self._hosts[0])
        self._device = cuda.to_device(self._hosts[0])
        views = unpack(self._device, layout)
        token_ids, positions, query_seq, slots, tables = views[:5]
        tiles = None if self.tile_queries is None else PrefillTiles(*views[5:], B)
        self.greedy_ids = cuda.to_device(np.zeros(B, np.int32))  # each row's argmax; the next step's FED_BACK ids
        self._batch = DeviceBatch(token_ids, positions, query_seq, slots, tables, decode_only=True,
                                  prefill_tiles=tiles, fed_back=self.greedy_ids)
        assert tables.shape == (B, W)
        self._record(BufferArena())
        self.logits = self.output

    def _launch(self):
        """The forward pass over the static inputs and each row's argmax. The argmax is part of the graph so
        that an all-greedy step launches nothing else (from Python, a launch costs more than the kernel)."""
        logits = self.forward.device_forward(self._batch)
        argmax(logits, out=self.greedy_ids)
        return logits

    def _inputs(self, batch: ForwardBatch) -> list[np.ndarray]:
        """The batch's arrays padded to the bucket: rows past len(batch) are dummy queries."""
        B, W, T = self.bucket, self.width, batch.num_tokens
        assert T <= B and batch.block_tables.shape[1] <= W, (T, B, batch.block_tables.shape, W)
        token_ids = np.zeros(B, np.int32)
        positions = np.zeros(B, np.int32)
        slots = np.full(B, -1, np.int32)
        tables = np.full((B, W), -1, np.int32)
        token_ids[:T], positions[:T], slots[:T] = batch.token_ids, batch.positions, batch.slot_mapping
        tables[:T, :batch.block_tables.shape[1]] = batch.block_tables[batch.query_seq]
        tables[T:, 0] = 0
        query_seq = np.arange(B, dtype=np.int32)
        arrays = [token_ids, positions, query_seq, slots, tables]
        if self.tile_queries is not None:  # a tile per row, the padding rows' too
            arrays += prefill_tiles_host(query_seq, positions, self.tile_queries, B)
        return arrays

    def run(self, batch: ForwardBatch) -> tuple:
        """Run the step for `batch` (decode-only, logits for every row): device arrays of the logits
        [T, vocab] and of each row's argmax [T], valid until the next run of this bucket."""
        self._fill_and_replay(batch)
        return self.logits[:batch.num_tokens], self.greedy_ids[:batch.num_tokens]

    def launch(self, batch: ForwardBatch) -> "PendingTokens":
        """Start the step for `batch` without waiting for it: rows whose token id is FED_BACK embed the token
        the previous step of this bucket picked in that row. Returns the greedy tokens to come. The caller
        reads them (PendingTokens.tokens) before it launches this bucket twice more: the two host buffers
        and events are then free again."""
        turn, self._turn = self._turn, 1 - self._turn
        stream = cuda.default_stream()  # the legacy default stream, as every launch: copies stay in order
        self._fill_and_replay(batch, self._hosts[turn], stream)
        tokens = self._tokens_host[turn]
        self.greedy_ids.copy_to_host(tokens, stream=stream)
        done = self._done[turn]
        done.record(stream)
        return PendingTokens(tokens, batch.num_tokens, done)

    def _fill_and_replay(self, batch: ForwardBatch, host=None, stream=0) -> None:
        host = self._hosts[0] if host is None else host
        pack_int32(self._inputs(batch), out=host)
        self._device.copy_to_device(host, stream=stream)  # stream 0: a synchronous copy
        self._replay()


class PendingTokens:
    """The greedy tokens of a launched step, on their way to pinned host memory."""

    def __init__(self, host, num_tokens: int, done):
        self._host, self._num_tokens, self._done = host, num_tokens, done

    def tokens(self) -> list[int]:
        """Wait for the step (and only it: later launches keep running) and return its tokens."""
        self._done.synchronize()
        return self._host[:self._num_tokens].tolist()


class BucketGraphs:
    """Captured steps of one engine, one per bucket (sizes in `buckets`), captured on first use. Subclasses build a
    bucket's step (`_make`) and name it for the log (`_describe`)."""

    def __init__(self, buckets: tuple[int, ...], log=None):
        self.buckets = buckets
        self._captured: dict = {}
        self._log = log or (lambda message: None)

    def bucket_for(self, size: int) -> int:
        return next(b for b in self.buckets if b >= size)

    def capture_all(self, progress=None) -> None:
        """Capture every bucket now (a server's warm-up), largest first, as vLLM does; `progress` reports."""
        for done, bucket in enumerate(sorted(self.buckets, reverse=True), 1):
            self._capture(bucket, quiet=True)
            if progress:
                progress(done, len(self.buckets))

    def _capture(self, bucket: int, quiet: bool = False):
        if bucket not in self._captured:
            start = time.perf_counter()
            self._captured[bucket] = step = self._make(bucket)
            kind = "recorded" if SIMULATOR else "captured a CUDA graph"
            if not quiet:
                self._log(f"{self._describe(bucket, step)}: {kind} in {time.perf_counter() - start:.2f} s")
        return self._captured[bucket]

    def _make(self, bucket: int) -> CapturedStep:
        raise NotImplementedError

    def _describe(self, bucket: int, step: CapturedStep) -> str:
        raise NotImplementedError

    @property
    def captured_buckets(self) -> list[int]:
        return sorted(self._captured)


class DecodeGraphs(BucketGraphs):
    """The captured decode steps of one engine, one per batch-size bucket, captured on first use."""

    def __init__(self, forward: ForwardPass, max_batch: int, max_blocks_per_seq: int, log=None):
        super().__init__(buckets_up_to(max_batch), log)
        self.forward, self.max_blocks_per_seq = forward, max_blocks_per_seq

    def can_run(self, batch: ForwardBatch) -> bool:
        """Decode-only, every row sampled, and a bucket fits it."""
        T = batch.num_tokens
        return (T <= self.buckets[-1] and batch.is_decode_only and batch.samples_every_token
                and batch.block_tables.shape[1] <= self.max_blocks_per_seq)

    def run(self, batch: ForwardBatch):
        return self._capture(self.bucket_for(batch.num_tokens)).run(batch)

    def launch(self, batch: ForwardBatch) -> PendingTokens:
        return self._capture(self.bucket_for(batch.num_tokens)).launch(batch)

    def _make(self, bucket: int) -> CapturedDecode:
        return CapturedDecode(self.forward, bucket, self.max_blocks_per_seq)

    def _describe(self, bucket: int, step: CapturedDecode) -> str:
        return f"decode step for batch size {bucket}"
