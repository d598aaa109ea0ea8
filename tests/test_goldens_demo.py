"""The demo model's forward pass against the HF transformers goldens (goldens/demo.npz), stage by stage."""
import numpy as np
import pytest

from tinyvllm.engine.engine import EngineConfig, LLMEngine
from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens, check_goldens
from tinyvllm.model.loader import load_model
from tinyvllm.model.weights import load_weights


@pytest.fixture(scope="module")
def goldens():
    return Goldens.load(DEFAULT_GOLDENS)


def quiet_engine(**options):
    return LLMEngine(None, EngineConfig(num_blocks=64, **options), log=lambda message: None)


@pytest.mark.slow  # engine-level: every stage of whole generations
def test_every_stage_and_greedy_continuation_match(goldens):
    """The paged engine path, all golden prompts prefilled together in one step, then decoded together."""
    engine = quiet_engine()
    report = check_goldens(engine, goldens)
    num_layers = engine.model.config.num_hidden_layers
    assert len(report.stages) == len(goldens.prompts) * (3 + 10 * num_layers)
    assert all(s.note == "" for s in report.stages), "every stage has a golden and the right shape"
    failures = [(s.prompt, s.stage, s.max_rel) for s in report.stages if not s.passed]
    assert not failures, failures
    assert len(report.greedy) == len(goldens.prompts)
    assert all(g.passed and len(g.golden) >= 8 for g in report.greedy), report.greedy
    assert report.passed


@pytest.mark.slow  # engine-level: every stage of whole generations
def test_fused_norm_layers_match_the_goldens_too(goldens):
    """The layer the GPU runs for decode-sized steps (RMSNorm fused in front of the q|k|v and gate|up GEMVs,
    residual adds behind o_proj and down_proj: ModelRunner._fused_layers), forced on for every step here. One
    prompt: the simulator runs this layer's gemv_coalesced blocks with syncthreads, ~10x the plain gemv's time."""
    engine = quiet_engine()
    engine.runner.forward_pass.fuse_norms = True
    first_prompt_only = Goldens(goldens.path, goldens.meta, goldens.prompts[:1])
    report = check_goldens(engine, first_prompt_only)
    assert engine.runner.forward_pass.fuses_norms(1) and len(report.stages) == 3 + 10 * engine.model.config.num_hidden_layers
    failures = [(s.prompt, s.stage, s.max_rel) for s in report.stages if not s.passed]
    assert not failures, failures
    assert all(g.passed and len(g.golden) >= 8 for g in report.greedy), report.greedy


def test_a_corrupted_weight_is_caught_at_its_first_stage(goldens, monkeypatch):
    """Flip one layer-1 MLP weight: everything before layers.1.mlp still passes, that stage fails first."""
    import tinyvllm.model.loader as model_module

    def corrupted_load(model_dir, config, **kwargs):
        weights = load_weights(model_dir, config, **kwargs)
        name = "model.layers.1.mlp.down_proj.weight"
        w = weights[name].copy()
        w[3, :] = np.uint16(0x4000)  # every weight of output row 3 becomes 2.0
        weights[name] = w
        return weights
    monkeypatch.setattr(model_module, "load_weights", corrupted_load)
    first_prompt_only = Goldens(goldens.path, goldens.meta, goldens.prompts[:1])
    report = check_goldens(quiet_engine(), first_prompt_only, check_greedy=False)
    first_failure = report.first_failure
    assert first_failure is not None and first_failure.stage == "layers.1.mlp"
    assert all(r.passed for r in report.stages[:report.stages.index(first_failure)])


def test_goldens_file_errors_name_the_file(tmp_path):
    from tinyvllm.errors import TinyVLLMError
    with pytest.raises(TinyVLLMError, match="not found"):
        Goldens.load(tmp_path / "missing.npz")
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(DEFAULT_GOLDENS.read_bytes()[:1000])
    with pytest.raises(TinyVLLMError, match="truncated.npz"):
        Goldens.load(truncated)
