"""Where a prefill step's wall time went beyond its graph, in the bench's engine configuration. It wraps
CapturedPrefill.run as it was at 2e32d62, where the LM head ran eagerly after the replay, and synchronizes and times
each piece.

    python docs/bench/scripts/round14_ttft_breakdown.py   # after scripts/write_random_1b.py /tmp/llama-1b-random
"""
import statistics, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path.cwd()))
from numba import cuda
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.runner.kernel_plan import resolve_precision
from tinyvllm.model.loader import load_model
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.runner import prefill_graphs as pg, model_runner as mr

model = load_model(Path("/tmp/llama-1b-random"), log=print)
config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=4097,
                      precision=resolve_precision("auto", model.weights.embed_tokens.dtype))
engine = LLMEngine(model, config, log=print)
params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, seed=0)
rng = np.random.default_rng(0)
T = {}
def add(key, dt): T.setdefault(key, []).append(dt)

orig_run = pg.CapturedPrefill.run
def run(self, batch):
    cuda.synchronize(); t0 = time.perf_counter()
    pg.pack_int32(self._inputs(batch), out=self._host); t1 = time.perf_counter()
    self._device.copy_to_device(self._host); cuda.synchronize(); t2 = time.perf_counter()
    self._replay(); cuda.synchronize(); t3 = time.perf_counter()
    every_row = batch.samples_every_token
    x = self.output[:batch.num_tokens]
    rows = None if every_row else cuda.to_device(np.asarray(batch.logits_rows, np.int32))
    cuda.synchronize(); t4 = time.perf_counter()
    out = self.forward.logits(x, rows); cuda.synchronize(); t5 = time.perf_counter()
    add("inputs pack", t1 - t0); add("inputs copy", t2 - t1); add("graph replay", t3 - t2); add("rows up", t4 - t3); add("lm head", t5 - t4)
    return out
orig_sample = mr.ModelRunner.sample
def sample(self, *a, **k):
    cuda.synchronize(); t0 = time.perf_counter(); out = orig_sample(self, *a, **k); cuda.synchronize(); add("sample", time.perf_counter() - t0); return out
orig_build = mr.build_inputs
def build(*a, **k):
    t0 = time.perf_counter(); out = orig_build(*a, **k); add("build_inputs", time.perf_counter() - t0); return out

def one(ids, timed):
    t0 = time.perf_counter(); rid = engine.add_request(ids, params)
    done = False
    while not done:
        outs = engine.step(); done = any(o.request_id == rid and o.finished for o in outs)
    if timed: add("step total", time.perf_counter() - t0)
    return engine.metrics.request_metrics(rid).ttft

for n in (128, 1024, 4096):
    one(rng.integers(1, 20000, n).tolist(), False)
for n in (128, 1024, 4096):
    plain = [one(rng.integers(1, 20000, n).tolist(), False) for _ in range(5)]
    pg.CapturedPrefill.run, mr.ModelRunner.sample, mr.build_inputs = run, sample, build
    T.clear()
    for _ in range(5): one(rng.integers(1, 20000, n).tolist(), True)
    pg.CapturedPrefill.run, mr.ModelRunner.sample, mr.build_inputs = orig_run, orig_sample, orig_build
    parts = {k: 1e3 * statistics.median(v) for k, v in T.items()}
    inner = sum(v for k, v in parts.items() if k != "step total")
    print(f"{n} tokens: plain TTFT {1e3*statistics.median(plain):.2f} ms; synchronized: " +
          ", ".join(f"{k} {v:.3f}" for k, v in parts.items()) + f"; other host {parts['step total'] - inner:.3f} ms")
