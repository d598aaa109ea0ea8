"""The web chat page (GET /) in a real headless browser: Debian's chromium driven by selenium, against a
tinyvllm server on a free localhost port, in the simulator on the demo model.

A chat with a system prompt and a completion each stream, token by token, exactly the text offline
LLM.generate gives for the same prompt (greedy); the request's TTFT / tok/s line appears; the server panel
refreshes on its own and counts the request; an invalid field shows the server's error in the page.
Skips where chromium, chromedriver or selenium is missing; with TINYVLLM_REQUIRE_REFERENCES=1 (CI) fails.
"""
import re
import shutil
import time

import pytest

from tinyvllm import LLM, SamplingParams
from tinyvllm.model.loader import load_model
from tests.references import missing_reference
from tests.serving_helpers import ENGINE_OPTIONS, quiet, start_server

pytestmark = pytest.mark.slow  # end to end: a server and headless chromium

MAX_TOKENS = 3
CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Where is the river?"}]
COMPLETION = "The sun rose over the town"
WAIT_S = 120  # the simulator makes about one engine step a second on a busy 2-core machine


def find_browser() -> tuple[str, str]:
    """(chromium, chromedriver) paths; skips (or, with TINYVLLM_REQUIRE_REFERENCES=1, fails) without them."""
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[web-test]')")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None:
        missing.append("chromium (apt-get install chromium)")
    if driver is None:
        missing.append("chromedriver (apt-get install chromium-driver)")
    if missing:
        missing_reference("a headless browser: " + ", ".join(missing))
    return chromium, driver


@pytest.fixture(scope="module")
def browser_paths():
    return find_browser()


@pytest.fixture(scope="module")
def offline():
    """Greedy LLM.generate outputs for CHAT and COMPLETION, before the server runs (the simulator must not
    run two engines' kernels at once). No ignore_eos: the page does not send it either."""
    model = load_model(log=quiet)
    llm = LLM(model, log=quiet, **ENGINE_OPTIONS)
    chat, completion = llm.generate([CHAT, COMPLETION], SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    return {"model": model, "chat": chat, "completion": completion}


@pytest.fixture(scope="module")
def server(browser_paths, offline):
    running = start_server(offline["model"])
    yield running
    running.stop()


@pytest.fixture(scope="module")
def driver(browser_paths, server):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    chromium, chromedriver = browser_paths
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,800"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(chromedriver), options=options)  # no selenium-manager download
    yield browser
    browser.quit()


def by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.ID, element_id)


def wait_for(driver, condition, what: str, timeout: float = WAIT_S):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: condition(), message=what)


def open_page(driver, server) -> int:
    """Load the page; once the server panel has its first /state: the panel's request count."""
    driver.get(server.url + "/")
    wait_for(driver, lambda: by_id(driver, "state-requests").text.isdigit(), "the server panel's first update", 30)
    return int(by_id(driver, "state-requests").text)


def type_into(driver, element_id: str, text: str) -> None:
    element = by_id(driver, element_id)
    element.clear()
    element.send_keys(text)


def send_and_watch(driver) -> tuple[str, list[str], str]:
    """Click Send; (the streamed answer, every distinct text it showed while streaming, the stats line)."""
    from selenium.webdriver.common.by import By
    by_id(driver, "send").click()
    answer = wait_for(driver, lambda: (driver.find_elements(By.CSS_SELECTOR, ".message.assistant") or [None])[-1],
                      "the answer's element", 10)
    seen = []
    deadline = time.monotonic() + WAIT_S
    while "streaming" in answer.get_attribute("class"):
        text = answer.get_property("textContent")  # exact (.text trims and folds whitespace)
        if text and (not seen or seen[-1] != text):
            seen.append(text)
        assert time.monotonic() < deadline, f"still streaming after {WAIT_S} s: {seen}"
        time.sleep(0.05)
    assert not by_id(driver, "error").is_displayed(), by_id(driver, "error").text
    return answer.get_property("textContent"), seen, by_id(driver, "request-stats").text


def check_stats_line(stats: str, expected) -> None:
    """'TTFT 812 ms · 1.2 tok/s · 3 tokens · 2.61 s · finish: length' for the offline output `expected`."""
    n = len(expected.token_ids)
    match = re.fullmatch(rf"TTFT (\d+) ms · ([\d.]+) tok/s · {n} tokens · ([\d.]+) s · finish: {expected.finish_reason}",
                         stats)
    assert match, stats
    ttft_ms, tok_s, total_s = int(match[1]), float(match[2]), float(match[3])
    assert 0 < ttft_ms <= 1000 * total_s + 1
    assert tok_s == pytest.approx((n - 1) / (total_s - ttft_ms / 1000), rel=0.05, abs=0.1)


def test_a_chat_streams_the_offline_greedy_text_and_the_panel_counts_it(driver, server, offline):
    before = open_page(driver, server)
    assert by_id(driver, "mode-chat").is_selected() and by_id(driver, "system").is_displayed()
    type_into(driver, "max-tokens", str(MAX_TOKENS))
    type_into(driver, "temperature", "0")
    type_into(driver, "system", CHAT[0]["content"])
    type_into(driver, "prompt", CHAT[1]["content"])
    text, seen, stats = send_and_watch(driver)

    expected = offline["chat"]
    assert text == expected.text and len(expected.token_ids) == MAX_TOKENS
    # streamed: the answer grew through shorter prefixes of itself before the end
    assert len(seen) >= 2 and all(expected.text.startswith(s) for s in seen) and seen[0] != expected.text, seen
    check_stats_line(stats, expected)
    # the panel refreshes on its own (no reload) and counts the request
    wait_for(driver, lambda: by_id(driver, "state-requests").text == str(before + 1), "the panel's request count", 10)
    assert re.fullmatch(r"\d+ / \d+ ms", by_id(driver, "state-ttft").text), by_id(driver, "state-ttft").text
    assert by_id(driver, "state-running").text == by_id(driver, "state-waiting").text == "0"
    assert by_id(driver, "state-errors").text == "0"
    updated = by_id(driver, "state-updated").text
    wait_for(driver, lambda: by_id(driver, "state-updated").text != updated, "another panel update", 5)


def test_a_completion_streams_the_offline_greedy_continuation(driver, server, offline):
    before = open_page(driver, server)
    by_id(driver, "mode-completion").click()
    assert not by_id(driver, "system").is_displayed()
    type_into(driver, "max-tokens", str(MAX_TOKENS))
    type_into(driver, "prompt", COMPLETION)
    text, seen, stats = send_and_watch(driver)
    expected = offline["completion"]
    assert text == expected.text and len(seen) >= 2, seen
    check_stats_line(stats, expected)
    wait_for(driver, lambda: by_id(driver, "state-requests").text == str(before + 1), "the panel's request count", 10)


def test_the_servers_error_is_shown_and_counted(driver, server):
    open_page(driver, server)
    errors = int(by_id(driver, "state-errors").text)
    client_errors = int(by_id(driver, "state-http-errors").text.split(" / ")[0])
    type_into(driver, "max-tokens", "100000")
    type_into(driver, "prompt", "Hello")
    by_id(driver, "send").click()
    wait_for(driver, lambda: by_id(driver, "error").is_displayed(), "the error box", 30)
    message = by_id(driver, "error").text
    assert message.startswith("400: ") and "max_tokens" in message, message
    assert by_id(driver, "send").is_enabled() and not by_id(driver, "stop").is_enabled()
    wait_for(driver, lambda: by_id(driver, "state-http-errors").text.split(" / ")[0] == str(client_errors + 1),
             "the panel's client error count", 10)
    assert by_id(driver, "state-errors").text == str(errors)  # a client's 400 is not an engine error


def test_stop_aborts_the_streaming_request_and_frees_its_kv_blocks(driver, server):
    open_page(driver, server)
    aborted = server.state()["requests_finished"]["abort"]
    type_into(driver, "max-tokens", "200")
    type_into(driver, "prompt", "Hello")
    by_id(driver, "send").click()
    answer = wait_for(driver, lambda: driver.execute_script(
        "const m = document.querySelector('.message.assistant.streaming'); return m && m.textContent && m;"),
        "the first streamed text")
    by_id(driver, "stop").click()
    wait_for(driver, lambda: by_id(driver, "request-stats").text == "stopped", "the stopped line", 10)
    assert "stopped" in answer.get_attribute("class") and not by_id(driver, "error").is_displayed()
    state = server.wait_idle(timeout=30)
    assert state["requests_finished"]["abort"] == aborted + 1 and state["kv_blocks"]["used"] == 0
