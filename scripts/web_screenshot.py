"""Remake docs/web-chat.png: the web chat page after a chat answer has streamed, in headless chromium.

    NUMBA_ENABLE_CUDASIM=1 python scripts/web_screenshot.py [--out docs/web-chat.png] [--max-tokens 24]
    NUMBA_ENABLE_CUDASIM=1 python scripts/web_screenshot.py --out docs/web-charts.png --other-requests 5 \
        --num-blocks 24 --window 1100,1000

Starts `tinyvllm serve` on the demo model on a free localhost port, opens the page with selenium (Debian's chromium
and chromedriver), sends one chat turn with a system prompt (and, with --other-requests, that many completions of
different lengths from other clients at the same time, for the charts), waits for the answer and a panel refresh,
saves the screenshot and stops the server.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

SYSTEM = "You are a concise assistant."
PROMPT = "Tell me about the river near the old town."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the server exited with status {server.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    sys.exit("the server did not come up")


def other_requests(url: str, n: int) -> list[threading.Thread]:
    """n completions of 8, 14, 20, ... tokens from other clients, started now, a second apart."""
    def complete(k: int) -> None:
        time.sleep(k)
        httpx.post(url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 8 + 6 * k},
                   timeout=600).raise_for_status()

    threads = [threading.Thread(target=complete, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    return threads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/web-chat.png")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--other-requests", type=int, default=0, help="completions sent beside the chat turn")
    p.add_argument("--num-blocks", type=int, help="the server's KV blocks (a small pool shows on the KV chart)")
    p.add_argument("--window", default="1100,620", help="the browser window's WIDTH,HEIGHT")
    args = p.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    blocks = ["--num-blocks", str(args.num_blocks)] if args.num_blocks else []
    server = subprocess.Popen([sys.executable, "-m", "tinyvllm.cli", "serve", "--port", str(port), *blocks],
                              env={**os.environ, "NUMBA_ENABLE_CUDASIM": os.environ.get("NUMBA_ENABLE_CUDASIM", "1")})
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={args.window}",
                "--hide-scrollbars"):
        options.add_argument(arg)
    driver = None
    try:
        wait_healthy(url, server)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                                  options=options)
        driver.get(url + "/")
        wait = WebDriverWait(driver, 300, poll_frequency=0.1)
        wait.until(lambda d: d.find_element(By.ID, "state-requests").text.isdigit())
        for element_id, text in (("max-tokens", str(args.max_tokens)), ("system", SYSTEM), ("prompt", PROMPT)):
            element = driver.find_element(By.ID, element_id)
            element.clear()
            element.send_keys(text)
        others = other_requests(url, args.other_requests)
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: d.find_element(By.ID, "request-stats").text)
        for t in others:
            t.join()
        wait.until(lambda d: d.find_element(By.ID, "state-requests").text == str(1 + len(others)))
        time.sleep(1.5)  # one more panel refresh
        driver.save_screenshot(args.out)
        print(f"wrote {args.out}: {driver.find_element(By.ID, 'request-stats').text}")
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
