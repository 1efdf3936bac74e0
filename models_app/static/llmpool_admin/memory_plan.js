/* llm-pool workbench: the memory plan before a load (POST .../load with dry_run=true).
 *
 * Load (or Check memory) first asks for the plan and shows it with a bar per device; only
 * "Confirm load" sends the load itself, through workbench.js's own submit handler.  This
 * listener runs first (capture on the document) and holds the submit back until then.
 */
(function () {
  "use strict";

  const root = document.querySelector('[data-llmpool-page="model"]');
  if (!root) return;
  const form = root.querySelector("[data-load-form]");
  const box = root.querySelector("[data-load-plan]");
  const actions = root.querySelector("[data-plan-actions]");
  const confirmButton = root.querySelector("[data-plan-confirm]");
  if (!form || !box || !actions) return;
  let confirmed = false;

  function clearPlan() {
    box.replaceChildren();
    actions.hidden = true;
  }

  async function askPlan() {
    const data = new FormData(form);
    data.set("dry_run", "true");
    const token = form.querySelector("input[name=csrfmiddlewaretoken]");
    box.textContent = "Checking memory…";
    actions.hidden = true;
    const response = await fetch(form.getAttribute("action"), {
      method: "POST",
      body: data,
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-CSRFToken": token ? token.value : "" },
    });
    let body = null;
    try {
      body = await response.json();
    } catch (error) {
      box.textContent = "No plan: HTTP " + response.status + " " + response.statusText;
      return;
    }
    box.innerHTML = body.plan_html || "";
    if (!body.ok && body.form_html !== undefined) form.innerHTML = body.form_html;
    const plan = body.plan;
    if (!plan) return;
    // A refused plan cannot be confirmed: the load would be refused the same way (409).
    confirmButton.disabled = plan.action === "refuse";
    confirmButton.textContent = plan.action === "evict" ? "Evict and load" : "Confirm load";
    actions.hidden = false;
  }

  document.addEventListener(
    "submit",
    function (event) {
      if (event.target !== form) return;
      if (confirmed) {
        confirmed = false; // the load itself: workbench.js posts it
        clearPlan();
        return;
      }
      event.preventDefault();
      event.stopImmediatePropagation();
      askPlan();
    },
    true
  );

  confirmButton.addEventListener("click", function () {
    confirmed = true;
    form.requestSubmit(form.querySelector("[data-load-submit]"));
  });
  root.querySelector("[data-plan-cancel]").addEventListener("click", clearPlan);
  form.addEventListener("change", clearPlan); // a plan is for the values it was asked with
})();
