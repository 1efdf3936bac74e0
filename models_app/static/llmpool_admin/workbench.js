/* llm-pool workbench: live updates over the admin WebSocket, and forms that post without leaving the page.
 *
 * The page root ([data-llmpool-page]) says which page this is.  Events come from
 * /admin/llm-pool/ws: "snapshot" (every entry), "transition" (with the entry after it),
 * "counters" and "catalog".  Elements marked data-field="..." are updated in place.
 */
(function () {
  "use strict";

  const root = document.querySelector("[data-llmpool-page]");
  if (!root) return;
  const page = root.dataset.llmpoolPage;
  const handlers = [];
  const STATE_CLASS = /\bstate-(unloaded|loading|loaded|unloading|failed)\b/g;

  // ---- helpers ------------------------------------------------------------------------------
  function csrfToken() {
    const input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  async function post(url, data) {
    const response = await fetch(url, {
      method: "POST",
      body: data,
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-CSRFToken": csrfToken() },
    });
    let body = null;
    try {
      body = await response.json();
    } catch (error) {
      body = { ok: false, message: "HTTP " + response.status + " " + response.statusText };
    }
    return { status: response.status, body: body };
  }

  // Shows the answer to an action; a new action's answers replace the previous ones.
  function clearMessages() {
    const list = root.querySelector("[data-messages]");
    if (list) list.replaceChildren();
  }

  function showMessage(level, text) {
    const list = root.querySelector("[data-messages]");
    if (!list) return;
    const item = document.createElement("li");
    item.className = level;
    item.textContent = text;
    list.prepend(item);
    while (list.children.length > 6) list.lastElementChild.remove();
  }

  function vramText(entry) {
    const size = entry.vram_estimate_mib === null ? "unknown" : entry.vram_estimate_mib + " MiB";
    const count = entry.vram_estimate_replica_count;
    return { size: size, detail: "for " + count + " replica" + (count === 1 ? "" : "s") + " · " + entry.vram_estimate_source };
  }

  function setField(scope, name, value) {
    scope.querySelectorAll('[data-field="' + name + '"]').forEach(function (element) {
      if (name === "runtime_state") {
        element.textContent = value;
        element.className = element.className.replace(STATE_CLASS, "").trim() + " state-" + value;
      } else if (name === "vram") {
        const text = vramText(value);
        element.firstChild.textContent = text.size + " ";
        element.querySelector(".quiet").textContent = text.detail;
      } else {
        element.textContent = value === null || value === undefined ? "" : String(value);
      }
    });
  }

  function applyCounters(scope, counters) {
    ["inflight_requests", "queue_depth", "runtime_inflight"].forEach(function (key) {
      if (key in counters) setField(scope, key, counters[key]);
    });
    if ("loaded_replicas" in counters && "replicas" in counters) {
      setField(scope, "replicas_text", counters.loaded_replicas + " / " + counters.replicas);
    }
    if (counters.fairness) {
      setField(scope, "rejected_per_key_limit", counters.fairness.rejected_per_key_limit);
      setField(scope, "rejected_executor_limit", counters.fairness.rejected_executor_limit);
    }
  }

  // The TTL countdown of every element with data-expires-at (an idle model's idle_expires_at).
  function tickCountdowns() {
    document.querySelectorAll("[data-expires-at]").forEach(function (element) {
      const at = element.dataset.expiresAt;
      if (!at) {
        element.textContent = "not counting";
        return;
      }
      const left = Math.max(0, Math.round((Date.parse(at) - Date.now()) / 1000));
      element.textContent = "idle, unloads in " + left + " s";
    });
  }

  function applySwitching(scope, entry) {
    scope.querySelectorAll("[data-expires-at]").forEach(function (element) {
      element.dataset.expiresAt = entry.idle_expires_at || "";
    });
    setField(scope, "last_reason", entry.last_reason);
    setField(scope, "waiting_requests", entry.waiting_requests);
    tickCountdowns();
  }

  function applyEntry(scope, entry) {
    setField(scope, "runtime_state", entry.runtime_state);
    setField(scope, "last_error", entry.last_error);
    applySwitching(scope, entry);
    setField(scope, "vram", entry);
    applyCounters(scope, entry);
    if (scope.matches && scope.matches("tr")) {
      scope.className = scope.className.replace(STATE_CLASS, "").trim() + " state-" + entry.runtime_state;
    }
  }

  // Whether the operator changed a field of a form inside `scope` since it was drawn.
  function edited(scope) {
    return Array.from(scope.querySelectorAll("input, select, textarea")).some(function (field) {
      if (field.type === "checkbox" || field.type === "radio") return field.checked !== field.defaultChecked;
      if (field.tagName === "SELECT") {
        const drawn = Array.from(field.options).findIndex(function (option) {
          return option.defaultSelected;
        });
        return field.selectedIndex !== Math.max(drawn, 0);
      }
      return field.type !== "hidden" && field.type !== "submit" && field.value !== field.defaultValue;
    });
  }

  // One refresh at a time; events that arrive meanwhile ask for one more. `guard`, when given, is
  // called as a fetch starts and returns a check made before the answer is shown: false keeps what
  // the page has (an edit the operator is making, or a fresher answer drawn meanwhile).
  function refresher(url, target, after, guard) {
    let running = false;
    let again = false;
    let timer = null;
    async function run() {
      if (running) {
        again = true;
        return;
      }
      running = true;
      const stillWanted = guard ? guard() : null;
      try {
        const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
        const html = response.ok ? await response.text() : null;
        if (html !== null && (!stillWanted || stillWanted())) {
          target.innerHTML = html;
          drawFeed();  // the fragment comes with an empty feed and the server-side countdown text
          tickCountdowns();
          if (after) after();
        }
        // Counts the answers dealt with, drawn or kept (the browser tests wait on it).
        if (html !== null) target.dataset.refreshes = String(Number(target.dataset.refreshes || 0) + 1);
      } catch (error) {
        /* the next event or the reconnect refreshes again */
      } finally {
        running = false;
        if (again) {
          again = false;
          run();
        }
      }
    }
    return function soon(delay) {
      clearTimeout(timer);
      timer = setTimeout(run, delay === undefined ? 100 : delay);
    };
  }

  // ---- the live feed ------------------------------------------------------------------------
  function connect(delay) {
    const status = document.querySelector("[data-live-status]");
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + root.dataset.wsPath);
    socket.addEventListener("open", function () {
      delay = 500;
      if (status) {
        status.textContent = "live";
        status.className = "live-status live";
      }
    });
    socket.addEventListener("message", function (message) {
      const event = JSON.parse(message.data);
      handlers.forEach(function (handler) {
        handler(event);
      });
    });
    socket.addEventListener("close", function () {
      if (status) {
        status.textContent = "reconnecting…";
        status.className = "live-status down";
      }
      setTimeout(function () {
        connect(Math.min(delay * 2, 10000));
      }, delay);
    });
  }

  // ---- models list --------------------------------------------------------------------------
  function initModels() {
    const form = root.querySelector("[data-action-form]");
    const rows = root.querySelector("[data-rows]");
    const refreshRows = refresher(root.dataset.rowsUrl, rows);
    const rowOf = function (name) {
      return Array.from(rows.querySelectorAll("tr[data-model]")).find(function (row) {
        return row.dataset.model === name;
      });
    };
    const counter = root.querySelector("[data-selection-counter]");
    const selectAll = root.querySelector("[data-select-all]");

    function countSelection() {
      const boxes = rows.querySelectorAll("input.action-select");
      const checked = rows.querySelectorAll("input.action-select:checked");
      counter.textContent = checked.length + " of " + boxes.length + " selected";
      boxes.forEach(function (box) {
        box.closest("tr").classList.toggle("selected", box.checked);
      });
    }
    selectAll.addEventListener("change", function () {
      rows.querySelectorAll("input.action-select").forEach(function (box) {
        box.checked = selectAll.checked;
      });
      countSelection();
    });
    rows.addEventListener("change", countSelection);

    handlers.push(function (event) {
      if (event.kind === "snapshot" && event.models) {
        event.models.forEach(function (entry) {
          const row = rowOf(entry.name);
          if (row) applyEntry(row, entry);
        });
      } else if (event.kind === "transition" && event.entry) {
        const row = rowOf(event.model);
        if (row) applyEntry(row, event.entry);
      } else if (event.kind === "counters") {
        const row = rowOf(event.model);
        if (row) applyCounters(row, event);
      } else if (event.kind === "catalog") {
        refreshRows(0);
      }
    });

    form.addEventListener("submit", async function (event) {
      event.preventDefault();
      const data = new FormData(form, event.submitter);
      let names = data.getAll("_selected_action");
      let action = data.get("action");
      if (data.get("single")) {
        const parts = data.get("single").split(":");
        action = parts.shift();
        names = [parts.join(":")];
      }
      clearMessages();
      if (!action || names.length === 0) {
        showMessage("warning", "Choose an action and at least one model.");
        return;
      }
      names.forEach(function (name) {
        const row = rowOf(name);
        if (row) row.classList.add("pending");
      });
      const answer = await post(form.getAttribute("action"), data);
      names.forEach(function (name) {
        const row = rowOf(name);
        if (row) row.classList.remove("pending");
      });
      if (!answer.body.results) {
        showMessage("error", (answer.body.error && answer.body.error.message) || answer.body.message);
        return;
      }
      answer.body.results.forEach(function (result) {
        showMessage(result.ok ? "success" : "error", result.summary);
        const row = rowOf(result.model);
        if (row && result.entry) applyEntry(row, result.entry);
      });
    });
  }

  // ---- one model ----------------------------------------------------------------------------
  const FEED_LENGTH = 20;
  const feedItems = [];

  // The live feed keeps the model's last transitions (the refreshed live fragment redraws the list).
  function addToFeed(event) {
    const time = (event.at || "").replace(/^.*T/, "").replace(/Z$/, "");
    feedItems.unshift(time + " " + event.from + " \u2192 " + event.to + " (" + (event.reason || "-") + ")"
      + (event.last_error ? ": " + event.last_error : ""));
    feedItems.length = Math.min(feedItems.length, FEED_LENGTH);
    drawFeed();
  }

  function drawFeed() {
    const feed = document.querySelector("[data-transition-feed]");
    if (!feed || feedItems.length === 0) return;
    feed.replaceChildren.apply(feed, feedItems.map(function (text) {
      const item = document.createElement("li");
      item.textContent = text;
      return item;
    }));
  }

  function initModel() {
    const name = root.dataset.model;
    const live = root.querySelector("[data-live]");
    const refreshSummary = refresher(root.dataset.liveUrl, live);
    const refreshDetails = refresher(root.dataset.detailsUrl, root.querySelector("[data-details]"));
    const refreshLive = function (delay) {
      refreshSummary(delay);
      refreshDetails(delay);
    };
    const loadForm = root.querySelector("[data-load-form]");
    const unloadForm = root.querySelector("[data-unload-form]");
    // Sleep / Wake and Reconfigure (runtime.residency): a fragment shown while the model is loaded.
    const residency = root.querySelector("[data-residency]");
    let residencyDrawn = 0;  // counts the fragments an action's answer drew
    let residencyPosting = false;
    const refreshResidency = refresher(residency.dataset.residencyUrl, residency, function () {
      syncResidencyNulls();
    }, function () {
      const drawn = residencyDrawn;
      return function () {
        return drawn === residencyDrawn && !residencyPosting && !edited(residency);
      };
    });

    handlers.push(function (event) {
      if (event.kind === "snapshot" && event.models) {
        refreshLive(0);
        refreshResidency(0);
      } else if (event.model === name && event.kind === "transition") {
        if (event.entry) applyEntry(live, event.entry);
        addToFeed(event);
        refreshLive(0);
        refreshResidency(0);
      } else if (event.model === name && ["slept", "woke", "reconfigured"].indexOf(event.kind) >= 0) {
        refreshResidency(0);
        refreshDetails(0);
      } else if (event.model === name && event.kind === "counters") {
        applyCounters(live, event);
        refreshLive(250);
      } else if (event.kind === "catalog") {
        showMessage("info", "The settings were reloaded; reload this page to see a changed definition.");
      }
    });

    function syncNullToggles() {
      loadForm.querySelectorAll('input[type=checkbox][name$="__null"]').forEach(function (box) {
        const input = loadForm.elements[box.name.slice(0, -"__null".length)];
        if (input) input.disabled = box.checked;
      });
    }

    function applyPreset(button) {
      const values = JSON.parse(button.dataset.preset);
      Object.keys(values).forEach(function (field) {
        const value = values[field];
        const input = loadForm.elements[field];
        const nullBox = loadForm.elements[field + "__null"];
        if (!input) return;
        if (value === null) {
          if (nullBox) nullBox.checked = true;
          else if (input.tagName === "SELECT") input.value = "null";
        } else {
          if (nullBox) nullBox.checked = false;
          input.value = typeof value === "string" ? value : JSON.stringify(value);
        }
      });
      loadForm.querySelectorAll("[data-preset]").forEach(function (other) {
        other.classList.toggle("selected", other === button);
      });
      syncNullToggles();
    }

    loadForm.addEventListener("click", function (event) {
      const button = event.target.closest("[data-preset]");
      if (button) applyPreset(button);
    });
    loadForm.addEventListener("change", function (event) {
      if (event.target.name && event.target.name.endsWith("__null")) syncNullToggles();
    });
    syncNullToggles();

    loadForm.addEventListener("submit", async function (event) {
      event.preventDefault();
      const submit = loadForm.querySelector("[data-load-submit]");
      submit.disabled = true;
      submit.value = "Loading…";
      const answer = await post(loadForm.getAttribute("action"), new FormData(loadForm));
      clearMessages();
      if (answer.body.form_html !== undefined) {
        loadForm.innerHTML = answer.body.form_html;
        syncNullToggles();
      } else {
        submit.disabled = false;
        submit.value = "Load";
      }
      showMessage(answer.body.ok ? "success" : "error", answer.body.message);
      if (answer.body.entry) applyEntry(live, answer.body.entry);
      refreshLive(0);
    });

    function syncResidencyNulls() {
      residency.querySelectorAll('input[type=checkbox][name$="__null"]').forEach(function (box) {
        const form = box.form;
        const input = form && form.elements[box.name.slice(0, -"__null".length)];
        if (input) input.disabled = box.checked;
      });
    }
    residency.addEventListener("change", function (event) {
      if (event.target.name && event.target.name.endsWith("__null")) syncResidencyNulls();
    });
    syncResidencyNulls();

    residency.addEventListener("submit", async function (event) {
      const form = event.target;
      if (!form.matches("[data-residency-action], [data-reconfigure-form]")) return;
      event.preventDefault();
      const submit = form.querySelector("input[type=submit]");
      if (submit) submit.disabled = true;
      residencyPosting = true;
      let answer;
      try {
        answer = await post(form.getAttribute("action"), new FormData(form));
      } finally {
        residencyPosting = false;
      }
      clearMessages();
      if (answer.body.residency_html !== undefined) {
        residencyDrawn += 1;
        residency.innerHTML = answer.body.residency_html;
        syncResidencyNulls();
      } else if (submit) {
        submit.disabled = false;
      }
      showMessage(answer.body.ok ? "success" : "error", answer.body.message);
      if (answer.body.entry) applyEntry(live, answer.body.entry);
      refreshLive(0);
    });

    unloadForm.addEventListener("submit", async function (event) {
      event.preventDefault();
      const answer = await post(unloadForm.getAttribute("action"), new FormData(unloadForm));
      clearMessages();
      showMessage(answer.body.ok ? "success" : "error", answer.body.message);
      if (answer.body.entry) applyEntry(live, answer.body.entry);
      refreshLive(0);
    });
  }

  // ---- GPU memory ---------------------------------------------------------------------------
  function initGpu() {
    const refreshGpu = refresher(root.dataset.gpuUrl, root.querySelector("[data-gpu]"));
    handlers.push(function (event) {
      if (event.kind === "transition" || event.kind === "catalog") refreshGpu(300);
    });
    setInterval(function () {
      refreshGpu(0);
    }, 10000);
  }

  if (page === "models") initModels();
  if (page === "model") initModel();
  tickCountdowns();
  setInterval(tickCountdowns, 1000);
  if (page === "gpu") initGpu();
  if (root.dataset.wsPath) connect(500);
})();
