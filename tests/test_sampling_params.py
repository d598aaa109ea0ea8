import dataclasses
import math

import numpy as np
import pytest

from tinyvllm.model.config import GenerationDefaults
from tinyvllm.errors import TinyVLLMError
from tinyvllm.engine.sampling_params import InvalidSamplingParams, SamplingParams


def test_defaults_match_vllm():
    params = SamplingParams()
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (1.0, 1.0, -1, None)
    assert (params.max_tokens, params.min_tokens, params.stop, params.stop_token_ids, params.ignore_eos) == \
        (16, 0, (), (), False)
    assert not params.greedy


def test_normalises_to_immutable_plain_values():
    params = SamplingParams(temperature=0, top_p=np.float32(0.5), top_k=np.int32(3), seed=np.int64(2**63 - 1),
                            stop="###", stop_token_ids=[7, np.int64(0)])
    assert params.greedy and params.temperature == 0.0 and type(params.temperature) is float
    assert type(params.top_p) is float and type(params.top_k) is int and type(params.seed) is int
    assert params.stop == ("###",) and params.stop_token_ids == (7, 0)
    assert all(type(t) is int for t in params.stop_token_ids)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")
    assert hash(params) == hash(dataclasses.replace(params))  # frozen and hashable
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 1.0


@pytest.mark.parametrize("field, value, allowed", [
    ("temperature", -0.1, ">= 0"), ("temperature", math.inf, "finite"), ("temperature", math.nan, "finite"),
    ("temperature", "1", "number"), ("temperature", True, "number"),
    ("top_p", 0.0, "(0, 1]"), ("top_p", 1.01, "(0, 1]"), ("top_p", math.nan, "(0, 1]"),
    ("top_k", -2, "-1 or 0"), ("top_k", 2.0, "integer"),
    ("seed", -1, "[0, 2**63)"), ("seed", 2**63, "[0, 2**63)"), ("seed", 1.5, "integer"),
    ("max_tokens", 0, ">= 1"), ("max_tokens", 3.0, "integer"),
    ("min_tokens", -1, "[0, max_tokens=16]"), ("min_tokens", 17, "[0, max_tokens=16]"),
    ("stop", "", "non-empty"), ("stop", ["ok", ""], "non-empty"), ("stop", [3], "strings"), ("stop", None, "sequence"),
    ("stop_token_ids", [1, -1], ">= 0"), ("stop_token_ids", 5, "sequence"), ("stop_token_ids", [1.0], "integers"),
    ("ignore_eos", 1, "True or False"),
])
def test_rejects_out_of_range_naming_the_field(field, value, allowed):
    with pytest.raises(InvalidSamplingParams) as caught:
        SamplingParams(**{field: value})
    message = str(caught.value)
    assert message.startswith(f"{field} must be ") and allowed in message and repr(value) in message, message


def test_error_is_a_tinyvllm_error_and_a_value_error():
    assert issubclass(InvalidSamplingParams, TinyVLLMError) and issubclass(InvalidSamplingParams, ValueError)


@pytest.mark.parametrize("settings", [
    {"temperature": 0.0}, {"top_p": 1.0}, {"top_p": 1e-9}, {"top_k": -1}, {"top_k": 0}, {"top_k": 1},
    {"seed": 0}, {"seed": 2**63 - 1}, {"max_tokens": 1, "min_tokens": 1}, {"min_tokens": 0}, {"min_tokens": 16},
])
def test_accepts_the_edges_of_each_range_and_keeps_them(settings):
    params = SamplingParams(**settings)
    for field, value in settings.items():  # kept as given: not clamped, not mapped to another "off" value
        assert getattr(params, field) == value and type(getattr(params, field)) is type(value), (field, value)


def test_from_generation_defaults_llama32():
    # Llama 3.2 Instruct's generation_config.json: do_sample true, temperature 0.6, top_p 0.9
    defaults = GenerationDefaults(temperature=0.6, top_p=0.9, do_sample=True, eos_token_ids=(128001, 128009))
    params = SamplingParams.from_generation_defaults(defaults)
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.6, 0.9, -1, 16)
    assert params.stop_token_ids == ()  # EOS is the engine's business (ignore_eos), not a sampling setting


def test_from_generation_defaults_do_sample_and_overrides():
    greedy_model = GenerationDefaults(temperature=0.7, top_k=20, do_sample=False, max_new_tokens=64)
    params = SamplingParams.from_generation_defaults(greedy_model)
    assert params.greedy and params.top_k == 20 and params.max_tokens == 64
    # explicit arguments win over the model's suggestions, do_sample included
    params = SamplingParams.from_generation_defaults(greedy_model, temperature=0.8, max_tokens=5, seed=3)
    assert (params.temperature, params.max_tokens, params.seed, params.top_k) == (0.8, 5, 3, 20)
    assert SamplingParams.from_generation_defaults(GenerationDefaults()) == SamplingParams()
    unset_do_sample = GenerationDefaults(temperature=0.6)  # as vLLM: only do_sample=False means greedy
    assert SamplingParams.from_generation_defaults(unset_do_sample).temperature == 0.6


def test_from_generation_defaults_checks_overrides():
    with pytest.raises(InvalidSamplingParams, match="unknown sampling parameter.*max_new_tokens"):
        SamplingParams.from_generation_defaults(GenerationDefaults(), max_new_tokens=3)
    with pytest.raises(InvalidSamplingParams, match="top_p must be"):
        SamplingParams.from_generation_defaults(GenerationDefaults(), top_p=2.0)
