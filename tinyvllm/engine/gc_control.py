"""Driving the engine without the cyclic garbage collector: for loops that run many engine steps (eval scoring,
the bench's runs), whose per-request objects hold no reference cycles."""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def without_cyclic_gc():
    """No cyclic garbage collection while the engine runs. Its full collections walk every object alive (the
    questions, every prompt's token ids: millions) again and again, and its young ones run every few hundred
    allocations; scripts/eval_profile.py measured them at over half the host time of scoring. Nothing piles up
    meanwhile: the engine's per-request objects hold no reference cycles (release_request breaks the request <->
    sequence one; tests/test_eval_engine.py checks), so reference counting frees them. (HTTP clients give no such
    promise: the remote and HF backends keep the collector on.) Afterwards it runs as before over everything,
    the objects frozen here included."""
    enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()
