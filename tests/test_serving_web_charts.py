"""The web page's live charts in a real headless browser (the set-up of test_serving_web.py: Debian's chromium
driven by selenium, a tinyvllm server on a free localhost port, the simulator, the demo model).

While a completion streams, the tok/s chart is redrawn with the tokens of the seconds that pass and the
running chart shows the request; once it ends, the TTFT histogram holds one more request and the series' tokens add up to the server's
total. The page loads
nothing from anywhere but the server it came from (it must work offline).
"""
import re
import time
from pathlib import Path

import pytest

from tinyvllm.model.loader import load_model
from tinyvllm.serving.server import STATIC_DIR
from tests.serving_helpers import quiet, start_server
from tests.test_serving_web import WAIT_S, browser_paths, by_id, driver, type_into, wait_for  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # end to end: a server and headless chromium

MAX_TOKENS = 16  # a few tokens a second in the simulator: a stream that lasts many polls
POLL_MS = 250


@pytest.fixture(scope="module")
def server(browser_paths):
    running = start_server(load_model(log=quiet))
    yield running
    running.stop()


def open_page(driver, server) -> None:
    driver.get(f"{server.url}/?poll_ms={POLL_MS}")
    wait_for(driver, lambda: chart_paths(driver, "chart-tok-s"), "the first drawn tok/s chart", 30)


def chart_paths(driver, chart_id: str) -> list[str]:
    """The `d` of each line drawn in the chart (none before the first /state)."""
    return driver.execute_script(
        f"return [...document.querySelectorAll('#{chart_id} path.line')].map((p) => p.getAttribute('d'));")


def points_above_the_axis(driver, chart_id: str) -> int:
    """How many points of the chart's lines lie above its x axis (values above 0)."""
    axis_y = float(driver.execute_script(f"return document.querySelector('#{chart_id} line.axis').getAttribute('y1');"))
    ys = [float(y) for d in chart_paths(driver, chart_id) for y in re.findall(r"[\d.]+,([\d.]+)", d)]
    return sum(y < axis_y - 0.5 for y in ys)


def histogram_total(driver) -> int:
    return driver.execute_script(
        "return [...document.querySelectorAll('#chart-ttft rect.bar')].reduce((n, r) => n + Number(r.dataset.count), 0);")


def test_the_charts_follow_a_stream_and_the_ttft_histogram_counts_it(driver, server):
    open_page(driver, server)
    requests_before = histogram_total(driver)
    by_id(driver, "mode-completion").click()
    type_into(driver, "max-tokens", str(MAX_TOKENS))
    type_into(driver, "prompt", "The sun rose over the town")
    by_id(driver, "send").click()
    wait_for(driver, lambda: driver.execute_script("return document.querySelector('.message.assistant.streaming')"),
             "the stream's start", 30)

    tok_s_paths, raised, running_raised = set(), set(), 0
    deadline = time.monotonic() + WAIT_S
    while driver.execute_script("return document.querySelector('.message.assistant.streaming')"):
        tok_s_paths.update(chart_paths(driver, "chart-tok-s"))
        raised.add(points_above_the_axis(driver, "chart-tok-s"))
        running_raised = max(running_raised, points_above_the_axis(driver, "chart-requests"))
        assert time.monotonic() < deadline, f"still streaming after {WAIT_S} s"
        time.sleep(0.1)
    assert not by_id(driver, "error").is_displayed(), by_id(driver, "error").text

    # redrawn while it ran, with more seconds of tokens each time: not one drawing at the end
    assert len(tok_s_paths) >= 3 and len(raised - {0}) >= 2, (len(tok_s_paths), sorted(raised))
    assert running_raised > 0, "the running chart never showed the request"
    wait_for(driver, lambda: histogram_total(driver) == requests_before + 1, "the TTFT histogram's new request", 10)
    assert by_id(driver, "chart-ttft-now").text == f"{requests_before + 1} requests"
    # the series the charts drew holds every token the server sampled (it is younger than the series' window)
    wait_for(driver, lambda: sum(server.state()["series"]["output_tokens_per_s"]) == server.state()["output_tokens_total"],
             "the series' tokens adding up to the server's", 10)


def test_the_page_loads_nothing_from_another_origin(driver, server):
    open_page(driver, server)
    loaded = driver.execute_script(
        "return [location.href, ...performance.getEntriesByType('resource').map((e) => e.name)];")
    assert any(url.endswith("/static/charts.js") for url in loaded), loaded
    assert all(url.startswith(server.url + "/") for url in loaded), loaded
    # nor could it on another path through the page: no absolute or protocol-relative address in its files
    for path in sorted(Path(STATIC_DIR).iterdir()):
        text = path.read_text()
        assert not re.search(r"https?://|[\"'(]//", text), f"{path.name} names an external address"
