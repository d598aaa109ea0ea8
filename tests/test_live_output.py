"""generate's live output: --stream's ordered streaming and the progress bar, fed hand-made outputs."""
import io
from dataclasses import dataclass

from tinyvllm.cli.live_output import OrderedStream, ProgressBar


@dataclass
class Out:
    """What the live output reads from a RequestOutput."""
    request_id: str
    text: str
    token_ids: list
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None


class Recorder(io.StringIO):
    def __init__(self, tty=False):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_the_first_request_streams_live_and_later_ones_follow_in_prompt_order():
    out = Recorder()
    stream = OrderedStream(out)
    stream.add("0", "[0] 'a'")
    stream.add("1", "[1] 'b'")
    seen = []

    def feed(*args, **kwargs):
        stream.update(Out(*args, **kwargs))
        seen.append(out.getvalue())
    feed("1", "Late", [7])                         # request 1 runs alongside: held until 0 is done
    feed("0", "Hel", [1])
    feed("0", "Hello", [1, 2])
    feed("1", "Later", [7, 8], True, "length")
    feed("0", "Hello!", [1, 2, 3], True, "stop")
    assert seen == [
        "[0] 'a'\n",
        "[0] 'a'\nHel",
        "[0] 'a'\nHello",
        "[0] 'a'\nHello",
        "[0] 'a'\nHello!\n    (3 tokens, stop)\n[1] 'b'\nLater\n    (2 tokens, length)\n"]


def test_held_back_text_a_stop_string_or_a_partial_character_could_still_change():
    out = Recorder()
    stream = OrderedStream(out)
    stream.add("0", "[0] 'a'", stop=("END",))
    stream.update(Out("0", "one E", [1, 2]))          # "E" (and the character before) may begin "END"
    assert out.getvalue() == "[0] 'a'\none"
    stream.update(Out("0", "one EN\ufffd", [1, 2, 3]))  # an incomplete UTF-8 character decodes as U+FFFD
    assert out.getvalue() == "[0] 'a'\none "
    stream.update(Out("0", "one ", [1, 2, 3, 4], True, "stop"))  # the engine cut "END" from the text
    assert out.getvalue() == "[0] 'a'\none \n    (4 tokens, stop)\n"


def test_an_errored_request_shows_its_error_in_its_turn():
    out = Recorder()
    stream = OrderedStream(out)
    stream.add("0", "[0] 'a'")
    stream.add("1", "[1] 'b'")
    stream.update(Out("1", "", [], True, "error", "prompt too long"))
    stream.update(Out("0", "x", [5], True, "length"))
    assert out.getvalue() == "[0] 'a'\nx\n    (1 token, length)\n[1] 'b'\n    error: prompt too long\n"


def test_progress_counts_tokens_against_the_budgets_and_ends_at_100_percent():
    now = [0.0]
    log = Recorder()
    bar = ProgressBar({"0": 4, "1": 4}, out=log, log_every=1.0, clock=lambda: now[0], ticking=False)
    now[0] = 2.0
    bar.update(Out("0", "", [1, 2]))
    bar.update(Out("1", "", [1]))                   # within log_every of the last line: not written
    now[0] = 4.0
    bar.update(Out("1", "", [1], True, "stop"))     # stopped early: counts as its whole budget
    bar.close()
    lines = log.getvalue().splitlines()
    assert lines == [
        "generating [######..................]  25% · 0/2 requests · 2 tokens · 1.0 tok/s · 2 s · eta 0:06",
        "generating [##################......]  75% · 1/2 requests · 3 tokens · 0.8 tok/s · 4 s · eta 0:01"]  # no repeat


def test_on_a_terminal_the_bar_redraws_one_line():
    term = Recorder(tty=True)
    bar = ProgressBar({"0": 2}, out=term, clock=lambda: 1.0, ticking=False)
    bar.update(Out("0", "", [1, 2], True, "length"))
    bar.close()
    assert term.getvalue().count("\n") == 1 and term.getvalue().startswith("\rgenerating [")
    assert "100% · 1/1 requests" in term.getvalue() and "\x1b[K" in term.getvalue()
