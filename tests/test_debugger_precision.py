"""`tinyvllm debug --compare-precision`: the session steps a shadow engine of the other precision in lockstep and
reports each stage's difference; checked against a separate fast engine run directly, and through Pilot."""
import dataclasses

import numpy as np

from debugger.cli import debug_app
from debugger.session import Session, SessionOptions, StageRecord, StepRecord, as_rows
from kernels_numba.common import SIMULATOR
from tests.test_debugger_app import drive, press, shown
from tests.test_precision import BF16_ROUNDING, _roundings_upstream
from tinyvllm.cli import parse_args
from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens
import pytest

pytestmark = pytest.mark.slow  # engine-level: the demo model in both precisions, stage by stage

# Before the first bf16 rounding both engines compute in float32: the same kernels in the simulator (difference 0);
# on a GPU the fp32 plan may fuse an RMSNorm into its GEMV where the fast plan launches rmsnorm (another order of the
# same float32 sum, seen 1.6e-7 relative): float32 noise, well apart from one bf16 rounding's 2^-12 floor.
FLOAT32_ORDER_NOISE = 0.0 if SIMULATOR else 2.0**-16

PROMPT_TOKENS = (9, 7)   # short prompts: the simulator's tensor-core twins run one 16-row tile (test_precision.py)


def _quiet(message):
    pass


def _prompts(goldens):
    return [goldens.prompts[p]["input_ids"][:n].tolist() for p, n in enumerate(PROMPT_TOKENS)]


def _session(goldens):
    engine = LLMEngine(None, EngineConfig(precision="fp32", num_blocks=16, max_num_seqs=2), log=_quiet)
    return Session(engine, goldens, _prompts(goldens), SessionOptions(compare_precision=True))


def test_each_stage_reports_its_difference_from_the_other_precision_until_they_diverge(monkeypatch):
    """The prefill step stage by stage: the reported max abs, max rel (over max |fp32|) and per-row max abs equal
    those of the main engine's outputs against the shadow engine's, caught as its generator yields them; zero
    before the first bf16 rounding, between 2^-12 and 2^-8 n relative after n roundings (the bound and why:
    test_precision.py), so the fast kernels really ran. Then the shadow is made to sample other tokens: the
    session says where and compares no more."""
    goldens = Goldens.load(DEFAULT_GOLDENS)
    session = _session(goldens)
    assert session.shadow.label == "fp32 vs fast" and session.engine.precision == "fp32"
    shadow = session.shadow.engine
    assert shadow.precision == "fast" and shadow is not session.engine
    real_step_stages, fast, sampled = shadow.step_stages, {}, {}

    def watched(**kwargs):
        """The shadow's own step, each stage's output kept as it passes; its tokens are changed by _other_tokens."""
        steps = real_step_stages(**kwargs)
        while True:
            try:
                stage = next(steps)
            except StopIteration as done:
                return done.value
            fast[stage.name] = stage.to_host()
            yield stage
    monkeypatch.setattr(shadow, "step_stages", lambda **kwargs: _other_tokens(watched(**kwargs), sampled))
    seen = []
    while isinstance(event := session.step_stage(), StageRecord):
        diff, other = event.precision, fast[event.name]
        assert diff is not None and diff.stage == event.name and diff.label == "fp32 vs fast", event.name
        delta = np.abs(event.values.astype(np.float64) - other)
        assert diff.max_abs == delta.max(), event.name
        assert diff.max_rel == delta.max() / np.abs(event.values.astype(np.float64)).max(), event.name
        assert diff.row_max_abs == tuple(as_rows(delta).max(axis=1)), event.name
        n = _roundings_upstream(event.name)
        assert (diff.max_rel <= FLOAT32_ORDER_NOISE) if n == 0 else (2.0**-12 <= diff.max_rel <= BF16_ROUNDING * n), \
            f"{event.name}: rel {diff.max_rel:.3e}, n {n}"
        view = session.view().golden
        assert view.precision == diff and view.precision_note == ""
        seen.append(event.name)
    assert isinstance(event, StepRecord) and seen == list(fast)
    assert session.view().golden.precision_note == (f"precisions diverged at step 0 (req 0: token "
                                                    f"{event.new_tokens['0'][0]} vs {sampled['0'][0] + 1}); "
                                                    "comparison stopped")
    event = session.step_stage()
    assert event.precision is None and session.view().golden.precision is None


def _other_tokens(steps, sampled):
    """A step generator whose outputs sample token + 1 (what the step really sampled goes into `sampled`)."""
    outputs = yield from steps
    sampled.update({o.request_id: o.new_token_ids for o in outputs})
    return [dataclasses.replace(o, new_token_ids=[t + 1 for t in o.new_token_ids]) for o in outputs]


def test_the_panels_show_the_comparison_line():
    """`tinyvllm debug --compare-precision` through Pilot: after `l`, the golden diff panel names the stage's
    difference and the tensor panel's row line the row's."""
    args = parse_args(["debug", "--compare-precision", "--no-goldens", "--prompt", "Hello there",
                                 "--max-tokens", "2"])

    async def scenario(pilot):
        await press(pilot, "l")
        summary = shown(pilot.app, "#golden-summary")
        assert "fp32 vs fast at layers.0.output: max abs " in summary and " · max rel " in summary, summary
        record = pilot.app.session.current
        assert f"max abs {record.precision.max_abs:.3e}" in summary
        row_line = shown(pilot.app, "#inspector-row-label")
        assert f"fp32 vs fast max abs {record.precision.row_max_abs[-1]:.3e}" in row_line, row_line
    drive(debug_app(args), scenario)
