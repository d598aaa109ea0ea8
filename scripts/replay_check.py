"""Record a served session of concurrent clients and replay it: every request must come back token for token.

    python scripts/replay_check.py [--model DIR] [--clients 16] [--max-tokens 32] [--out DIR]

An in-process `tinyvllm serve` (real HTTP on a free localhost port, the engine loop with a Recorder) gets
--clients concurrent streamed /v1/completions from threads, staggered so they arrive at different engine
steps: a third greedy, a third sampled with a client seed, a third sampled with the seed the engine picks.
Then the recording is replayed into a fresh engine of the same configuration (on a GPU: CUDA graphs and
pipelined greedy decode, as the server ran). Prints the replay report and "PASS: n/n requests match" (exit 0)
or "FAIL" (exit 1). On the H200 this checks what the simulator tests cannot: that graph replay and the
pipelined decode steps replay deterministically too.
"""
from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinyvllm.engine.engine import EngineConfig, LLMEngine  # noqa: E402
from tinyvllm.model.loader import load_model  # noqa: E402
from tinyvllm.serving.server import listen, make_server  # noqa: E402
from tinyvllm.serving.engine_loop import EngineLoop  # noqa: E402
from tinyvllm.serving.recording import Recorder, read_recording  # noqa: E402
from tinyvllm.serving.replay import engine_config_for, format_report, replay  # noqa: E402

WORDS = "the river sun rose over a small town where every morning bakers sang old songs".split()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the demo model)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--out", default="replay-check", help="where session.jsonl goes")
    args = p.parse_args()
    import httpx
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "session.jsonl"
    model = load_model(args.model)
    engine = LLMEngine(model, EngineConfig(max_num_seqs=8, num_blocks=512))
    loop = EngineLoop(engine, recorder=Recorder.open(path, engine, model=args.model))
    server, _ = make_server(loop, "replay-check", log_level="warning")
    sock = listen("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions"
    loop.start()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    rng = random.Random(0)
    errors = []

    def client(i: int) -> None:
        body = {"model": "replay-check", "prompt": " ".join(rng.choice(WORDS) for _ in range(5 + i % 7)),
                "max_tokens": args.max_tokens, "ignore_eos": True, "stream": True,
                "temperature": [0, 0.8, 1.0][i % 3]}
        if i % 3 == 1:
            body["seed"] = 1000 + i
        try:
            with httpx.stream("POST", url, json=body, timeout=600) as r:
                if r.status_code != 200:
                    errors.append(f"client {i}: HTTP {r.status_code}: {r.read()!r}")
                for _ in r.iter_lines():
                    pass
        except httpx.HTTPError as e:
            errors.append(f"client {i}: {type(e).__name__}: {e}")

    threads = []
    for i in range(args.clients):
        threads.append(threading.Thread(target=client, args=(i,)))
        threads[-1].start()
        time.sleep(0.02 * (i % 4))  # staggered: arrivals land on different steps
    for t in threads:
        t.join()
    server.should_exit = True
    thread.join(timeout=60)
    loop.stop(timeout=0)
    if errors:
        print("FAIL: " + "; ".join(errors))
        return 1
    recording = read_recording(path)
    steps = sorted({r.step for r in recording.requests})
    print(f"recorded {len(recording.requests)} requests arriving at steps {steps}", flush=True)
    report = replay(recording, LLMEngine(model, engine_config_for(recording)))
    print(format_report(report))
    n = len(report.results)
    ok = report.num_matched == n and all(r.replayed_steps == r.recorded_steps for r in report.results)
    print(f"{'PASS' if ok else 'FAIL'}: {report.num_matched}/{n} requests match"
          + ("" if ok else " (or arrival / finish steps differ)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
