/* llm-pool workbench, model page: the playground and the live log pane.
 *
 * Playground ([data-playground]): a chat request sent to POST /v1/chat/completions exactly as a
 * client sends it (stream: true, stream_options.include_usage), the answer written in place as
 * its chunks arrive, then time to first token, tokens/s and the token counts.  An unloaded model
 * is said to be so (no request is sent) unless it has load_on_request: then the request is sent
 * and waits for the load.  With service.api_keys set the key typed here goes in the
 * Authorization header; it is kept in this page only (never stored).
 *
 * Log pane ([data-log-pane]): an EventSource on the workbench's logs stream (the same `log`
 * events as GET /v1/admin/models/{name}/logs?follow=true), one line per event.
 */
(function () {
  "use strict";

  // ---- playground ------------------------------------------------------------------------------
  const box = document.querySelector("[data-playground]");
  if (box) {
    const form = box.querySelector("[data-playground-form]");
    const status = box.querySelector("[data-playground-status]");
    const answer = box.querySelector("[data-playground-answer]");
    const figures = box.querySelector("[data-playground-figures]");
    const send = box.querySelector("[data-playground-send]");
    const stop = box.querySelector("[data-playground-stop]");
    const model = box.dataset.model;
    let controller = null;

    const liveState = () => {
      const badge = document.querySelector('#live-module [data-field="runtime_state"]');
      return badge ? badge.textContent.trim() : "loaded";
    };

    function body() {
      const messages = [];
      const system = form.elements.system.value.trim();
      if (system) messages.push({ role: "system", content: system });
      messages.push({ role: "user", content: form.elements.prompt.value });
      const request = { model: model, messages: messages, stream: true, stream_options: { include_usage: true } };
      form.querySelectorAll("[data-decoding]").forEach((input) => {
        if (input.value === "") return;
        request[input.name] = input.dataset.decoding === "number" ? Number(input.value) : input.value;
      });
      return request;
    }

    function finish(text, level) {
      status.textContent = text;
      status.className = "help" + (level ? " playground-" + level : "");
      send.disabled = false;
      stop.disabled = true;
      controller = null;
    }

    async function errorText(response) {
      try {
        const error = (await response.json()).error;
        return `${response.status} ${error.code}: ${error.message}`;
      } catch (e) {
        return `HTTP ${response.status}`;
      }
    }

    // Reads the SSE body: `data: {chunk}` lines, `data: [DONE]` at the end.
    async function* chunks(response) {
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const event = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
          if (!data) continue;
          if (data === "[DONE]") return;
          yield JSON.parse(data);
        }
      }
    }

    async function run() {
      const state = liveState();
      answer.textContent = "";
      figures.textContent = "";
      if (state !== "loaded" && box.dataset.loadOnRequest !== "true") {
        finish(`${model} is ${state}: load it first (the Load form above); nothing was sent.`, "error");
        return;
      }
      const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
      const key = form.elements.api_key;
      if (key) {
        if (!key.value) { finish("Enter an API key: service.api_keys is set.", "error"); key.focus(); return; }
        headers.Authorization = "Bearer " + key.value;
      }
      controller = new AbortController();
      send.disabled = true;
      stop.disabled = false;
      status.className = "help";
      status.textContent = state === "loaded" ? "Sent; waiting for the first token…"
        : `${model} is ${state}: load_on_request loads it; the request waits for the load…`;
      const started = performance.now();
      let first = null, usage = null, pieces = 0, finishReason = null;
      try {
        const response = await fetch("/v1/chat/completions", {
          method: "POST", headers: headers, body: JSON.stringify(body()), credentials: "omit",
          signal: controller.signal,
        });
        if (!response.ok) { finish(await errorText(response), "error"); return; }
        for await (const chunk of chunks(response)) {
          if (chunk.error) { finish(`${chunk.error.code}: ${chunk.error.message}`, "error"); return; }
          if (chunk.usage) usage = chunk.usage;
          const choice = (chunk.choices || [])[0];
          if (!choice) continue;
          const delta = choice.delta || {};
          const text = (delta.reasoning_content || "") + (delta.content || "");
          if (text) {
            if (first === null) { first = performance.now(); status.textContent = "Streaming…"; }
            answer.textContent += text;
            pieces += 1;
          }
          if (choice.finish_reason) finishReason = choice.finish_reason;
        }
      } catch (error) {
        finish(error.name === "AbortError" ? "Stopped." : "The request failed: " + error.message, "error");
        return;
      }
      const ended = performance.now();
      const output = usage ? usage.completion_tokens : pieces;
      const ttft = first === null ? null : first - started;
      const seconds = first === null ? 0 : (ended - first) / 1000;
      const rate = seconds > 0 ? (output / seconds).toFixed(1) : "—";
      box.dataset.ttftMs = ttft === null ? "" : String(Math.round(ttft));
      figures.textContent = `time to first token ${ttft === null ? "—" : Math.round(ttft) + " ms"} · ` +
        `${rate} tokens/s · ` +
        (usage ? `${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`
               : `${pieces} chunks`);
      finish(`Done (finish_reason ${finishReason || "—"}).`, "done");
    }

    form.addEventListener("submit", (event) => { event.preventDefault(); if (!controller) run(); });
    stop.addEventListener("click", () => { if (controller) controller.abort(); });
  }

  // ---- live log pane -----------------------------------------------------------------------------
  const pane = document.querySelector("[data-log-pane]");
  if (pane && window.EventSource) {
    const lines = pane.querySelector("[data-log-lines]");
    const logStatus = pane.querySelector("[data-log-status]");
    const MAX_LINES = 1000;
    const source = new EventSource(pane.dataset.logsUrl);
    source.addEventListener("open", () => {
      lines.textContent = ""; // a reconnect starts again from the tail
      logStatus.textContent = "live";
    });
    source.addEventListener("log", (event) => {
      const item = JSON.parse(event.data);
      const atBottom = lines.scrollTop + lines.clientHeight >= lines.scrollHeight - 4;
      const line = document.createElement("span");
      line.className = "log-line";
      line.dataset.replica = String(item.replica);
      line.textContent = `[${item.replica}] ${item.line}\n`;
      lines.appendChild(line);
      while (lines.childElementCount > MAX_LINES) lines.firstElementChild.remove();
      if (atBottom) lines.scrollTop = lines.scrollHeight;
    });
    source.addEventListener("error", (event) => {
      if (event.data) {
        const error = JSON.parse(event.data);
        logStatus.textContent = `${error.code}: ${error.message}`;
      } else {
        logStatus.textContent = source.readyState === EventSource.CLOSED ? "closed" : "reconnecting…";
      }
    });
    window.addEventListener("pagehide", () => source.close());
  }
})();
