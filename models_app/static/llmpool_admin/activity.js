/* llm-pool workbench, Activity page: polls ?fragment=json every 2 s (the runtime's activity
 * ring, device memory, loading models) and draws a live table, a progress bar per loading model
 * and two uPlot charts (vendored under vendor/uplot): tokens/s per model over the last five
 * minutes (each answered request's output tokens, summed per 10 s bucket) and device memory
 * over time (sampled at each poll, since the page opened). */
(function () {
  "use strict";
  const root = document.getElementById("activity-main");
  if (!root) return;
  const url = root.dataset.activityUrl;
  const WINDOW = 300, BUCKET = 10, POLL_MS = 2000;
  const memorySamples = []; // [seconds, {device: mib}]
  const charts = {};

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "—" : String(text);
    return td;
  }

  // Speculative decoding's figures of one request: "drafted / accepted", or none without drafts.
  function drafts(item) {
    return item.draft_tokens === null || item.draft_tokens === undefined
      ? null : `${item.draft_tokens} / ${item.accepted_draft_tokens}`;
  }

  function renderRows(requests) {
    const body = root.querySelector("[data-activity-rows]");
    body.replaceChildren(...requests.slice(0, 50).map((item) => {
      const tr = document.createElement("tr");
      tr.dataset.model = item.model || "";
      [item.at.replace("T", " ").replace("Z", ""), item.model, item.endpoint, item.fairness_key, item.status,
        item.input_tokens, item.output_tokens, item.time_to_first_token_ms, item.duration_ms,
        item.tokens_per_second, drafts(item), item.replica].forEach((value) => tr.appendChild(cell(value)));
      return tr;
    }));
  }

  function renderLoading(loading) {
    const box = root.querySelector("[data-loading]");
    box.replaceChildren(...loading.map((model) => {
      const div = document.createElement("div");
      div.className = "load-progress";
      div.dataset.model = model.name;
      const progress = model.load_progress || {};
      const bar = document.createElement("progress");
      bar.max = 1;
      if (progress.fraction !== null && progress.fraction !== undefined) bar.value = progress.fraction;
      div.append(model.name + " " + (progress.stage || "loading") + " ", bar);
      return div;
    }));
  }

  function draw(name, data, labels) {
    const element = root.querySelector(`[data-chart="${name}"]`);
    const key = labels.join("\u0000");
    if (!charts[name] || charts[name].key !== key) {
      if (charts[name]) charts[name].plot.destroy();
      const palette = ["#417690", "#c0392b", "#27ae60", "#8e44ad", "#d35400", "#2c3e50"];
      const series = [{}].concat(labels.map((label, i) => ({ label: label, stroke: palette[i % palette.length],
                                                             width: 2 })));
      charts[name] = { key: key, plot: new uPlot({ width: 560, height: 240, series: series }, data, element) };
    } else {
      charts[name].plot.setData(data);
    }
  }

  function tokensChart(requests, now) {
    const models = [...new Set(requests.filter((r) => r.model && r.status === 200).map((r) => r.model))].sort();
    const start = Math.floor((now - WINDOW) / BUCKET) * BUCKET;
    const xs = [];
    for (let t = start; t <= now; t += BUCKET) xs.push(t);
    const ys = models.map(() => xs.map(() => 0));
    requests.forEach((r) => {
      const at = Date.parse(r.at) / 1000, i = Math.floor((at - start) / BUCKET), m = models.indexOf(r.model);
      if (m >= 0 && i >= 0 && i < xs.length) ys[m][i] += (r.output_tokens || 0) / BUCKET;
    });
    // uPlot wants one data array per series: the placeholder series gets an empty one.
    draw("tokens", [xs, ...(models.length ? ys : [xs.map(() => null)])], models.length ? models : ["(no requests)"]);
  }

  function memoryChart(devices, now) {
    memorySamples.push([now, devices]);
    while (memorySamples.length && memorySamples[0][0] < now - WINDOW) memorySamples.shift();
    const names = [...new Set(memorySamples.flatMap(([, d]) => Object.keys(d)))].sort();
    const xs = memorySamples.map(([t]) => t);
    const ys = names.map((n) => memorySamples.map(([, d]) => (n in d ? d[n] : null)));
    draw("memory", [xs, ...(names.length ? ys : [xs.map(() => null)])], names.length ? names : ["(no devices)"]);
  }

  async function poll() {
    const status = root.querySelector("[data-activity-status]");
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      const body = await response.json();
      if (!response.ok) throw new Error(body.error ? body.error.message : "HTTP " + response.status);
      const now = Date.now() / 1000;
      renderRows(body.requests);
      renderLoading(body.loading);
      tokensChart(body.requests, now);
      memoryChart(body.devices, now);
      status.textContent = `${body.requests.length} recent requests; updated ${new Date().toLocaleTimeString()}`;
      root.dataset.updated = String(Number(root.dataset.updated || 0) + 1);
    } catch (error) {
      status.textContent = "The runtime did not answer: " + error.message;
    }
  }

  poll();
  setInterval(poll, POLL_MS);
})();
