// Tessera chat page: streams replies from /v1/chat/completions (fetch + ReadableStream,
// server-sent events parsed here) for the model or adapter picked from /v1/models.
// Model output only ever goes into the page as text (textContent / text nodes).
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "tessera.apiKey";

// The conversation sent with each request: completed {role, content} turns.
let history = [];
// The AbortController of the reply streaming now, if any.
let inflight = null;
// Bumped by "New conversation", so a reply still ending then is not added to the new one.
let conversation = 0;

function headers() {
  const h = { "content-type": "application/json" };
  const key = $("apikey").value.trim();
  if (key) h["authorization"] = "Bearer " + key;
  return h;
}

function showError(text) {
  const el = $("error");
  el.textContent = text;
  el.hidden = !text;
}

// An error message from a failed response: the server's JSON error, else the status text.
async function httpError(resp) {
  let detail = resp.statusText;
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) detail = body.error.message;
  } catch (_) { /* not JSON */ }
  let hint = "";
  if (resp.status === 401) hint = " Enter the server's API key above.";
  else if (resp.status === 503) hint = " The server is busy or its engine has stopped; try again later.";
  return "HTTP " + resp.status + ": " + detail + "." + hint;
}

async function loadModels() {
  const sel = $("model");
  const previous = sel.value;
  sel.disabled = true;
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (!resp.ok) throw new Error(await httpError(resp));
    const body = await resp.json();
    sel.replaceChildren();
    for (const m of body.data) {
      const opt = document.createElement("option");
      opt.value = m.id;
      opt.textContent = m.parent ? m.id + " (adapter of " + m.parent + ")" : m.id;
      sel.append(opt);
    }
    if ([...sel.options].some((o) => o.value === previous)) sel.value = previous;
    sel.disabled = sel.options.length === 0;
    sel.dataset.loaded = "true";
    showError("");
  } catch (e) {
    sel.replaceChildren(new Option("unavailable", ""));
    delete sel.dataset.loaded;
    showError("Could not load the model list: " + (e instanceof TypeError ? "the server is unreachable." : e.message));
  }
}

// Stop sequences: one per line; \n, \t and \\ are escapes.
function stopSequences() {
  return $("stop").value.split("\n")
    .map((s) => s.replace(/\\(n|t|\\)/g, (_, c) => (c === "n" ? "\n" : c === "t" ? "\t" : "\\")))
    .filter((s) => s.length > 0);
}

function requestBody(messages) {
  const body = {
    model: $("model").value,
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  const num = (id) => { const v = $(id).value.trim(); return v === "" ? null : Number(v); };
  for (const [field, id] of [["temperature", "temperature"], ["top_p", "top_p"], ["max_tokens", "max_tokens"], ["seed", "seed"]]) {
    const v = num(id);
    if (v !== null && !Number.isNaN(v)) body[field] = v;
  }
  const stop = stopSequences();
  if (stop.length) body.stop = stop;
  if ($("json").checked) body.response_format = { type: "json_object" };
  return body;
}

// A message element in the log; returns its content and meta elements.
function addMessage(role, text) {
  const li = document.createElement("li");
  li.className = "msg " + role;
  const who = document.createElement("div");
  who.className = "role";
  who.textContent = role === "user" ? "You" : "Assistant";
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = text;
  const meta = document.createElement("div");
  meta.className = "meta";
  li.append(who, content, meta);
  $("log").append(li);
  li.scrollIntoView({ block: "end" });
  return { li, content, meta };
}

function setStreaming(on) {
  $("send").disabled = on;
  $("stopbtn").disabled = !on;
  $("log").setAttribute("aria-busy", on ? "true" : "false");
}

// Reads server-sent events off a fetch response body; calls onData with each event's data.
async function readSse(body, onData) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/)
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data && onData(data) === false) { reader.cancel(); return; }
    }
  }
}

async function send(text) {
  if (inflight) return;
  if (!$("model").value) { showError("No model to talk to: the model list did not load."); return; }
  showError("");
  const system = $("system").value.trim();
  const turn = { role: "user", content: text };
  const messages = (system ? [{ role: "system", content: system }] : []).concat(history, [turn]);
  const body = requestBody(messages);
  addMessage("user", text);
  const reply = addMessage("assistant", "");
  reply.li.classList.add("streaming");
  const controller = new AbortController();
  const mine = conversation;
  inflight = controller;
  setStreaming(true);

  const started = performance.now();
  let firstAt = null, chunks = 0, usage = null, finish = null, done = false, failure = null;
  let answer = "";
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!resp.ok) throw new Error(await httpError(resp));
    await readSse(resp.body, (data) => {
      if (data === "[DONE]") { done = true; return false; }
      let ev;
      try { ev = JSON.parse(data); } catch (_) { failure = "unreadable event: " + data; return false; }
      if (ev.error) { failure = "Server error: " + (ev.error.message || "unknown"); return true; }
      if (ev.usage) usage = ev.usage;
      for (const c of ev.choices || []) {
        const piece = c.delta && c.delta.content;
        if (piece) {
          if (firstAt === null) firstAt = performance.now();
          chunks += 1;
          answer += piece;
          const atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 80;
          reply.content.append(document.createTextNode(piece));
          if (atBottom) reply.li.scrollIntoView({ block: "end" });
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
      return true;
    });
    if (!done && !failure) failure = "The stream ended before [DONE].";
  } catch (e) {
    if (e.name === "AbortError") finish = "stopped";
    else failure = e instanceof TypeError ? "Network error: the server is unreachable." : e.message;
  }
  const ended = performance.now();
  if (mine !== conversation) return; // the log was cleared meanwhile
  inflight = null;
  setStreaming(false);
  reply.li.classList.remove("streaming");
  reply.li.dataset.done = "true";

  if (failure && !answer) {
    // Nothing came back: drop the turn, give the message back to retry.
    reply.li.classList.add("failed");
    reply.content.textContent = failure;
    showError(failure);
    if (!$("input").value) $("input").value = text;
    return;
  }
  if (failure) { showError(failure); reply.li.classList.add("failed"); }
  if (answer) history.push(turn, { role: "assistant", content: answer });
  reply.meta.textContent = stats(usage, chunks, started, firstAt, ended, finish);
  if (finish === "stopped") reply.li.classList.add("stopped");
}

// Tokens/s: the usage chunk's completion_tokens (include_usage) over the seconds from the
// first streamed token to the end, i.e. the decode rate; time to first token separately.
// Without usage (a stopped stream ends before it) the content chunks are counted instead,
// marked "≈".
function stats(usage, chunks, started, firstAt, ended, finish) {
  const parts = [];
  const tokens = usage ? usage.completion_tokens : chunks;
  const approx = usage ? "" : "≈";
  parts.push(approx + tokens + (tokens === 1 ? " token" : " tokens"));
  if (firstAt !== null) {
    parts.push("first token " + Math.round(firstAt - started) + " ms");
    const secs = (ended - firstAt) / 1000;
    if (tokens > 1 && secs > 0) parts.push(approx + ((tokens - 1) / secs).toFixed(1) + " tok/s");
  }
  if (finish) parts.push(finish === "stopped" ? "stopped" : "finish: " + finish);
  return parts.join(" · ");
}

function newConversation() {
  if (inflight) inflight.abort();
  inflight = null;
  setStreaming(false);
  conversation += 1;
  history = [];
  $("log").replaceChildren();
  showError("");
  $("input").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  const stored = localStorage.getItem(KEY_STORE);
  if (stored) $("apikey").value = stored;
  $("apikey").addEventListener("change", () => {
    const key = $("apikey").value.trim();
    if (key) localStorage.setItem(KEY_STORE, key); else localStorage.removeItem(KEY_STORE);
    loadModels();
  });
  $("reload").addEventListener("click", loadModels);
  $("new").addEventListener("click", newConversation);
  $("stopbtn").addEventListener("click", () => { if (inflight) inflight.abort(); });
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if (!text || inflight) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  loadModels();
});
