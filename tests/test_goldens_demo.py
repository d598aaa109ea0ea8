"""The demo model's forward pass against the HF transformers goldens (goldens/demo.npz), stage by stage."""
import numpy as np
import pytest

from tinyvllm.golden_check import DEFAULT_GOLDENS, DEFAULT_RTOL, Goldens, check_goldens, stage_errors
from tinyvllm.model import load_model
from tinyvllm.weights import load_weights


@pytest.fixture(scope="module")
def goldens():
    return Goldens.load(DEFAULT_GOLDENS)


def test_every_stage_and_greedy_continuation_match(goldens):
    model = load_model(max_seq_len=128, log=lambda message: None)
    report = check_goldens(model, goldens)
    num_layers = model.config.num_hidden_layers
    assert len(report.stages) == len(goldens.prompts) * (3 + 10 * num_layers)
    assert all(s.note == "" for s in report.stages), "every stage has a golden and the right shape"
    failures = [(s.prompt, s.stage, s.max_rel) for s in report.stages if not s.passed]
    assert not failures, failures
    assert len(report.greedy) == len(goldens.prompts)
    assert all(g.passed and len(g.golden) >= 8 for g in report.greedy), report.greedy
    assert report.passed


def test_a_corrupted_weight_is_caught_at_its_first_stage(goldens, monkeypatch):
    """Flip one layer-1 MLP weight: everything before layers.1.mlp still passes, that stage fails first."""
    import tinyvllm.model as model_module

    def corrupted_load(model_dir, config, **kwargs):
        weights = load_weights(model_dir, config, **kwargs)
        name = "model.layers.1.mlp.down_proj.weight"
        w = weights[name].copy()
        w[3, :] = np.uint16(0x4000)  # every weight of output row 3 becomes 2.0
        weights[name] = w
        return weights
    monkeypatch.setattr(model_module, "load_weights", corrupted_load)
    model = load_model(max_seq_len=64, log=lambda message: None)
    golden = goldens.prompts[0]
    results = list(stage_errors(model, golden["input_ids"], golden, 0, DEFAULT_RTOL))
    first_failure = next(r for r in results if not r.passed)
    assert first_failure.stage == "layers.1.mlp"
    assert all(r.passed for r in results[:results.index(first_failure)])


def test_goldens_file_errors_name_the_file(tmp_path):
    from tinyvllm.errors import TinyVLLMError
    with pytest.raises(TinyVLLMError, match="not found"):
        Goldens.load(tmp_path / "missing.npz")
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(DEFAULT_GOLDENS.read_bytes()[:1000])
    with pytest.raises(TinyVLLMError, match="truncated.npz"):
        Goldens.load(truncated)
