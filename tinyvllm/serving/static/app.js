// The tinyvllm chat page. Sends a chat or a completion with stream: true and reads the server-sent events
// from fetch's ReadableStream; polls GET /state every second (or every ?poll_ms=N) for the server panel and
// its charts (charts.js). No libraries.
"use strict";

const STATE_POLL_MS = Math.max(100, Number(new URLSearchParams(location.search).get("poll_ms")) || 1000);
const $ = (id) => document.getElementById(id);

let history = [];          // the chat so far, [{role, content}], sent again with each chat turn
let inFlight = null;       // the AbortController of the request being streamed
let modelName = null;      // from /state; sent as `model`

// ---- one request ---------------------------------------------------------------------------------
function requestBody(text) {
  const body = {
    max_tokens: parseInt($("max-tokens").value, 10),
    temperature: parseFloat($("temperature").value),
    stream: true,
    stream_options: { include_usage: true },
  };
  if (modelName) body.model = modelName;
  if (!$("mode-chat").checked) return ["/v1/completions", { ...body, prompt: text }];
  const system = $("system").value.trim();
  const messages = [...(system ? [{ role: "system", content: system }] : []), ...history,
                    { role: "user", content: text }];
  return ["/v1/chat/completions", { ...body, messages }];
}

// Calls onData(parsed JSON) for each `data:` event until `data: [DONE]` or the end of the body.
async function readEvents(response, onData) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (data === "[DONE]") return;
      if (data) onData(JSON.parse(data));
    }
  }
}

async function errorMessage(response) {
  const text = await response.text();
  try {
    return `${response.status}: ${JSON.parse(text).error.message}`;
  } catch {
    return `${response.status}: ${text || response.statusText}`;
  }
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `message ${role}`;
  div.textContent = text;
  $("transcript").append(div);
  return div;
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || inFlight) return;
  const chat = $("mode-chat").checked;
  const [url, body] = requestBody(text);
  showError(null);
  addMessage(chat ? "user" : "prompt", text);
  const output = addMessage("assistant", "");
  output.classList.add("streaming");
  $("request-stats").textContent = "";
  setBusy(new AbortController());

  const start = performance.now();
  let first = null, tokens = null, finish = null, reply = "";
  try {
    const response = await fetch(url, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      signal: inFlight.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      for (const choice of chunk.choices || []) {
        const delta = chat ? choice.delta && choice.delta.content : choice.text;
        if (delta) {
          first ??= performance.now();
          reply += delta;
          output.textContent = reply;
        }
        finish = choice.finish_reason || finish;
      }
    });
    showStats(start, first, performance.now(), tokens, finish);
    if (chat) history.push({ role: "user", content: text }, { role: "assistant", content: reply });
    $("prompt").value = "";
  } catch (e) {
    const stopped = e.name === "AbortError";  // the Stop button: the server aborts the request
    output.classList.add(stopped ? "stopped" : "failed");
    if (stopped) $("request-stats").textContent = "stopped";
    else showError(e.message);
  } finally {
    output.classList.remove("streaming");
    setBusy(null);
  }
}

// TTFT: from sending to the first text; tok/s: the tokens after the first over the time after the first.
function showStats(start, first, end, tokens, finish) {
  const stats = $("request-stats");
  const parts = [];
  if (first !== null) parts.push(`TTFT ${(first - start).toFixed(0)} ms`);
  if (tokens > 1 && end > first) parts.push(`${((tokens - 1) / ((end - first) / 1000)).toFixed(1)} tok/s`);
  if (tokens !== null) parts.push(`${tokens} tokens`);
  parts.push(`${((end - start) / 1000).toFixed(2)} s`);
  if (finish) parts.push(`finish: ${finish}`);
  stats.textContent = parts.join(" · ");
  stats.dataset.ttftMs = first === null ? "" : (first - start).toFixed(1);
  stats.dataset.tokens = tokens ?? "";
}

function setBusy(controller) {
  inFlight = controller;
  $("send").disabled = controller !== null;
  $("stop").disabled = controller === null;
}

function showError(message) {
  $("error").hidden = !message;
  $("error").textContent = message || "";
}

// ---- the server panel ----------------------------------------------------------------------------
const ms = (v) => (v === null || v === undefined ? "–" : v.toFixed(0));

function renderState(s) {
  modelName = s.model;
  $("model-name").textContent = s.model;
  $("state-running").textContent = s.running;
  $("state-waiting").textContent = s.waiting;
  const kv = s.kv_blocks || {};
  $("state-kv").textContent = `${(100 * s.kv_cache_usage).toFixed(1)} % (${kv.used}/${kv.total} blocks)`;
  $("state-ttft").textContent = `${ms(s.ttft_ms.p50)} / ${ms(s.ttft_ms.p95)} ms`;
  $("state-tok-s").textContent = s.output_tokens_per_s.toFixed(1);
  const finished = s.requests_finished || {};
  $("state-requests").textContent = Object.values(finished).reduce((a, b) => a + b, 0);
  $("state-requests").title = Object.entries(finished).map(([k, v]) => `${k}: ${v}`).join(", ");
  $("state-errors").textContent = s.errors;
  $("state-errors").classList.toggle("bad", s.errors > 0);
  const http = s.http_errors || {};
  $("state-http-errors").textContent = `${http["4xx"]} / ${http["5xx"]}`;
  $("state-http-errors").classList.toggle("bad", http["5xx"] > 0);  // a client's 4xx is not the server's fault
  renderCharts(s);
  $("state-updated").textContent = `updated ${new Date().toLocaleTimeString()} · ${s.steps} steps · up ${s.uptime_s.toFixed(0)} s`;
}

// Each chart's current value is the table's (the series ends with the last whole second).
function renderCharts(s) {
  const series = s.series;
  const kvPercent = series.kv_cache_usage.map((u) => 100 * u);
  $("chart-tok-s").innerHTML = Charts.timeSeries({
    lines: [{ values: series.output_tokens_per_s, cls: "tok-s" }], seconds: series.seconds });
  $("chart-tok-s-now").textContent = s.output_tokens_per_s.toFixed(1);
  $("chart-requests").innerHTML = Charts.timeSeries({
    lines: [{ values: series.waiting, cls: "waiting" }, { values: series.running, cls: "running" }],
    seconds: series.seconds });
  $("chart-requests-now").textContent = `${s.running} / ${s.waiting}`;
  $("chart-kv").innerHTML = Charts.timeSeries({
    lines: [{ values: kvPercent, cls: "kv" }], seconds: series.seconds, top: 100, unit: "%" });
  $("chart-kv-now").textContent = `${(100 * s.kv_cache_usage).toFixed(1)} %`;
  const ttft = s.ttft_histogram;
  $("chart-ttft").innerHTML = Charts.histogram({ bounds: ttft.le_ms, counts: ttft.counts });
  $("chart-ttft-now").textContent = `${ttft.counts.reduce((a, b) => a + b, 0)} requests`;
}

async function pollState() {
  try {
    const response = await fetch("/state", { cache: "no-store" });
    if (!response.ok) throw new Error(await errorMessage(response));
    const state = await response.json();
    renderState(state);
    setHealth(state.engine_alive !== false, state.engine_alive === false ? "the engine loop has stopped" : "up");
  } catch (e) {
    setHealth(false, `server unreachable: ${e.message}`);
  } finally {
    setTimeout(pollState, STATE_POLL_MS);
  }
}

function setHealth(ok, title) {
  $("state-health").className = `dot ${ok ? "ok" : "bad"}`;
  $("state-health").title = title;
  if (!ok) $("state-updated").textContent = title;
}

// ---- wiring --------------------------------------------------------------------------------------
$("prompt-form").addEventListener("submit", send);
$("stop").addEventListener("click", () => inFlight && inFlight.abort());
$("clear").addEventListener("click", () => {
  history = [];
  $("transcript").replaceChildren();
  $("request-stats").textContent = "";
  showError(null);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("prompt-form").requestSubmit();
});
for (const radio of document.querySelectorAll('input[name="mode"]')) {
  radio.addEventListener("change", () => { $("system").hidden = !$("mode-chat").checked; });
}
pollState();
