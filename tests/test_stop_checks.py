"""check_stop without an engine: a Sequence, SamplingParams and a made-up detokenizer (one letter a token)."""
from tinyvllm.engine.sampling_params import SamplingParams
from tinyvllm.engine.sequence import Sequence
from tinyvllm.engine.stop_checks import Stop, check_stop, first_stop_string

PROMPT = [1, 2, 3]
EOS = frozenset({0})


def letters(ids: list[int]) -> str:
    return "".join(chr(ord("a") + t) for t in ids)


def seq_with(output: list[int], max_tokens: int = 10) -> Sequence:
    return Sequence(0, PROMPT, max_tokens, token_ids=PROMPT + output)


def stop(output, params=SamplingParams(), stop_ids=EOS, max_tokens=10):
    return check_stop(seq_with(output, max_tokens), params, stop_ids, letters)


def test_a_stop_token_ends_it_once_min_tokens_are_out():
    assert stop([5, 0]) == Stop("stop")
    assert stop([5, 6]) is None
    assert stop([5, 0], SamplingParams(min_tokens=3)) is None  # too early: the sampler suppresses it anyway
    assert stop([5, 6, 0], SamplingParams(min_tokens=3)) == Stop("stop")


def test_the_length_limit_ends_it_last():
    assert stop([5, 6, 7], max_tokens=3) == Stop("length")
    assert stop([5, 6], max_tokens=3) is None
    assert stop([5, 6, 0], max_tokens=3) == Stop("stop")  # a stop token on the last allowed token wins


def test_a_stop_string_cuts_the_text_before_it():
    # output "bcde": "cd" starts at 1, "e" at 3: the earliest wins, the string itself is cut
    assert stop([1, 2, 3, 4], SamplingParams(stop=["e", "cd"])) == Stop("stop", "b")
    assert stop([1, 2], SamplingParams(stop=["x"])) is None
    assert stop([1, 2, 3], SamplingParams(stop=["x"]), max_tokens=3) == Stop("length")
    assert stop([1, 2], SamplingParams(stop=["b"], min_tokens=3)) is None


def test_the_text_is_decoded_only_for_stop_strings():
    decoded = []
    check_stop(seq_with([5, 6]), SamplingParams(), EOS, lambda ids: decoded.append(ids) or "")
    assert decoded == []
    check_stop(seq_with([5, 6]), SamplingParams(stop=["q"]), EOS, lambda ids: decoded.append(ids) or "")
    assert decoded == [[5, 6]]  # the output only, not the prompt


def test_first_stop_string():
    assert first_stop_string("hello world", ["world", "o"]) == 4
    assert first_stop_string("hello", ["x"]) is None
    assert first_stop_string("hello", ["h"]) == 0
