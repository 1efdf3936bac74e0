"""The operator's workbench inside the Django admin: models, one model, GPU memory, settings.

Every page reads the runtime's live entries through ``selectors`` and every
action goes through ``services``, the same functions the REST API calls.  The
views are async so that a load that takes minutes holds no thread; a page's
live updates come from the WebSocket in ``consumers``.  Actions answer JSON
to the pages' scripts (``Accept: application/json``) and redirect with a
message otherwise, so every form also works without JavaScript.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from models_app import selectors, services
from models_app.api.errors import error_answer, error_json_response
from models_app.selectors import effective_values
from models_app.workbench.forms import LoadForm, ReconfigureForm, reconfigurable_constraints
from models_app.workbench.memory_bars import device_bars, gpu_bars, load_plan_context
from runtime.errors import InvalidRequest, LLMPoolError, UnknownModel

STATES = ["unloaded", "loading", "loaded", "unloading", "failed"]
ACTIONS = {"load": "Load", "unload": "Unload"}


def staff_view(view):
    return never_cache(staff_member_required(view))


def wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


async def render_page(request: HttpRequest, template: str, context: dict, status: int = 200) -> TemplateResponse:
    """An admin page: the admin site's context (sidebar, user tools) plus the page's own."""
    base = await sync_to_async(admin.site.each_context)(request)
    return TemplateResponse(request, template, {**base, **context}, status=status)


def error_of(exc: LLMPoolError) -> dict:
    return {**error_answer(exc).body["error"], "http_status": exc.http_status, "details": exc.details}


# ---- models list -------------------------------------------------------------------------


@staff_view
async def models_page(request: HttpRequest) -> HttpResponse:
    backend, state = request.GET.get("backend", ""), request.GET.get("state", "")
    try:
        answer, runtime_error = await selectors.models_answer(), None
    except LLMPoolError as exc:
        answer, runtime_error = {}, error_of(exc)
    entries = answer.get("models", [])
    # Several nodes: each node known to the pool, and whether it answered.
    nodes = answer.get("nodes") or []
    shown = [
        entry
        for entry in entries
        if (not backend or entry["resolved_backend"] == backend) and (not state or entry["runtime_state"] == state)
    ]
    context = {"entries": shown, "runtime_error": runtime_error, "actions": ACTIONS, "nodes": nodes,
               "nodes_down": [node for node in nodes if not node.get("alive")]}
    if request.GET.get("fragment") == "rows":
        return TemplateResponse(request, "llmpool_admin/_model_rows.html", context)
    backends = sorted({entry["resolved_backend"] for entry in entries} | ({backend} if backend else set()))
    filters = [
        _filter("backend", "backend", backends, backend, request),
        _filter("state", "runtime state", STATES, state, request),
    ]
    context.update(
        title="Models",
        is_nav_sidebar_enabled=False,  # the table needs the width
        filters=filters,
        filtered=bool(backend or state),
        total=len(entries),
    )
    return await render_page(request, "llmpool_admin/models.html", context)


def _filter(param: str, title: str, values: list[str], selected: str, request: HttpRequest) -> dict:
    def query(value: str) -> str:
        params = request.GET.copy()
        params.pop("fragment", None)
        if value:
            params[param] = value
        else:
            params.pop(param, None)
        return "?" + params.urlencode() if params else "?"

    choices = [{"display": "All", "query_string": query(""), "selected": not selected}]
    choices += [{"display": value, "query_string": query(value), "selected": value == selected} for value in values]
    return {"title": title, "choices": choices}


@staff_view
@require_POST
async def models_action(request: HttpRequest) -> HttpResponse:
    """Load or unload one model (``single=load:<name>``) or the selected ones, all at once."""
    action, names = request.POST.get("action", ""), request.POST.getlist("_selected_action")
    if request.POST.get("single"):
        action, _, name = request.POST["single"].partition(":")
        names = [name]
    if action not in ACTIONS or not names:
        problem = "Choose an action and at least one model."
        if wants_json(request):
            return error_json_response(InvalidRequest(problem))
        messages.warning(request, problem)
        return redirect(_back(request, reverse("llmpool_admin:models")))
    results = await asyncio.gather(*(_run_action(action, name) for name in names))
    if wants_json(request):
        return JsonResponse({"action": action, "results": results})
    for result in results:
        level = messages.SUCCESS if result["ok"] else messages.ERROR
        messages.add_message(request, level, result["summary"])
    return redirect(_back(request, reverse("llmpool_admin:models")))


async def _run_action(action: str, name: str) -> dict:
    try:
        entry = await (services.model_load(name, None) if action == "load" else services.model_unload(name))
    except LLMPoolError as exc:
        return {"model": name, "ok": False, "error": error_of(exc), "summary": f"{name}: {exc.code}: {exc.message}"}
    if entry["runtime_state"] == "failed":
        summary = f"{name}: {action} failed: {entry['last_error']}"
        return {"model": name, "ok": False, "entry": entry, "error": None, "summary": summary}
    return {"model": name, "ok": True, "entry": entry, "summary": f"{name} is {entry['runtime_state']}"}


def _back(request: HttpRequest, default: str) -> str:
    target = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return default


# ---- one model -------------------------------------------------------------------------------


async def _entry_or_404(name: str) -> dict:
    try:
        return await selectors.model_get(name)
    except UnknownModel:
        raise Http404(f"model {name!r} is not configured") from None


def live_context(entry: dict) -> dict:
    effective = [
        {**row, **{f"{key}_json": json.dumps(row[key]) for key in ("configured", "override", "effective")}}
        for row in effective_values(entry)
    ]
    return {"entry": entry, "effective": effective, "entry_json": json.dumps(entry, indent=2)}


@staff_view
async def model_page(request: HttpRequest, name: str) -> HttpResponse:
    try:
        entry = await _entry_or_404(name)
    except LLMPoolError as exc:
        return await render_page(request, "llmpool_admin/unavailable.html", {"title": name, "error": error_of(exc)}, 503)
    fragment = request.GET.get("fragment")
    if fragment in ("live", "details"):
        return TemplateResponse(request, f"llmpool_admin/_model_{fragment}.html", live_context(entry))
    if fragment == "residency":
        return TemplateResponse(request, "llmpool_admin/_residency.html", residency_context(entry))
    return await _model_response(request, entry, LoadForm(entry))


async def _model_response(request: HttpRequest, entry: dict, form: LoadForm, status: int = 200,
                          reconfigure_form: ReconfigureForm | None = None) -> HttpResponse:
    mirror = await sync_to_async(selectors.catalog_get)(entry["name"])
    context = {
        **live_context(entry),
        **residency_context(entry, reconfigure_form),
        "title": entry["name"],
        "form": form,
        "mirror": mirror,
        "mirror_json": json.dumps(mirror.definition, indent=2) if mirror else None,
    }
    return await render_page(request, "llmpool_admin/model.html", context, status)


@staff_view
@require_POST
async def model_load(request: HttpRequest, name: str) -> HttpResponse:
    """The Load form: 200 with the entry once loaded or failed, else the runtime's error on the form."""
    try:
        entry = await _entry_or_404(name)
    except LLMPoolError as exc:
        return _action_error(request, name, exc)
    form = LoadForm(entry, request.POST)
    if request.POST.get("dry_run") == "true" or request.GET.get("dry_run") == "true":
        return await _load_plan(request, entry, form)
    answer, status, message = await _submitted(form, lambda: services.model_load(name, form.load_body()))
    ok = answer is not None and answer["runtime_state"] != "failed"
    if answer is not None:
        entry = answer
        message = f"{name} is {entry['runtime_state']}" if ok else f"{name} failed to load: {entry['last_error']}"
        if ok:
            form = LoadForm(entry)
    if wants_json(request):
        form_html = await sync_to_async(render_to_string)("llmpool_admin/_load_form.html", {"form": form}, request)
        return JsonResponse({"ok": ok, "message": message, "entry": entry, "form_html": form_html}, status=status)
    if status == 200:
        messages.add_message(request, messages.SUCCESS if ok else messages.ERROR, message)
        return redirect("llmpool_admin:model", name=name)
    return await _model_response(request, entry, form, status)


async def _submitted(form, send: Callable[[], Awaitable[dict]]) -> tuple[dict | None, int, str]:
    """A form's call to the runtime: ``(its answer, 200, "")``; ``(None, status, message)`` for an
    invalid form (422) or the runtime's error, which the form then shows beside its fields."""
    if not form.is_valid():
        return None, 422, "Please correct the errors below."
    try:
        return await send(), 200, ""
    except LLMPoolError as exc:
        form.add_runtime_error(exc)
        return None, exc.http_status, f"{exc.code}: {exc.message}"


async def _load_plan(request: HttpRequest, entry: dict, form: LoadForm) -> HttpResponse:
    """The memory plan of this load (POST .../load?dry_run=true), shown before the operator confirms."""
    name, plan, status = entry["name"], None, 422
    if form.is_valid():
        try:
            plan, memory = await asyncio.gather(
                services.model_load(name, form.load_body(), dry_run=True), selectors.gpu_memory()
            )
        except LLMPoolError as exc:
            form.add_runtime_error(exc)
            status = exc.http_status
        else:
            status = 200
    context = {"entry": entry, "form": form, "plan": plan}
    if plan is not None:
        context.update(load_plan_context(plan, memory.get("devices") or []))
    plan_html = await sync_to_async(render_to_string)("llmpool_admin/_load_plan.html", context, request)
    if wants_json(request):
        form_html = await sync_to_async(render_to_string)("llmpool_admin/_load_form.html", {"form": form}, request)
        return JsonResponse({"ok": plan is not None, "plan": plan, "plan_html": plan_html, "form_html": form_html},
                            status=status)
    mirror_response = await _model_response(request, entry, form, status)
    mirror_response.context_data["plan_html"] = plan_html
    return mirror_response


@staff_view
@require_POST
async def model_unload(request: HttpRequest, name: str) -> HttpResponse:
    try:
        entry = await services.model_unload(name)
    except UnknownModel:
        raise Http404(f"model {name!r} is not configured") from None
    except LLMPoolError as exc:
        return _action_error(request, name, exc)
    message = f"{name} is {entry['runtime_state']}"
    if wants_json(request):
        return JsonResponse({"ok": True, "message": message, "entry": entry})
    messages.success(request, message)
    return redirect("llmpool_admin:model", name=name)


# ---- sleep, wake and reconfigure (runtime.model.residency) ------------------------------------------


def residency_context(entry: dict, form: ReconfigureForm | None = None) -> dict:
    """The residency module: Sleep or Wake (a sleepable backend) and the Reconfigure form (the
    reconfigurable constraints), both only while the model is loaded."""
    loaded = entry["runtime_state"] == "loaded"
    if form is None and loaded and reconfigurable_constraints(entry):
        form = ReconfigureForm(entry)
    sleepable = bool(entry.get("sleepable"))
    return {"entry": entry, "reconfigure_form": form if loaded else None, "sleepable": sleepable,
            "residency_shown": loaded and (sleepable or form is not None)}


async def _residency_html(request: HttpRequest, entry: dict, form: ReconfigureForm | None = None) -> str:
    return await sync_to_async(render_to_string)("llmpool_admin/_residency.html", residency_context(entry, form),
                                                 request)


@staff_view
@require_POST
async def model_residency(request: HttpRequest, name: str, op: str) -> HttpResponse:
    """The Sleep and Wake buttons: POST .../sleep or .../wake through ``services``."""
    try:
        entry = await services.model_residency(name, op)
    except UnknownModel:
        raise Http404(f"model {name!r} is not configured") from None
    except LLMPoolError as exc:
        return _action_error(request, name, exc)
    done = entry.get("slept" if op == "sleep" else "woke") or {}
    message = f"{name} is {entry['residency']} ({op} took {done.get('duration_ms', 0):g} ms)"
    if wants_json(request):
        html = await _residency_html(request, entry)
        return JsonResponse({"ok": True, "message": message, "entry": entry, "residency_html": html})
    messages.success(request, message)
    return redirect("llmpool_admin:model", name=name)


@staff_view
@require_POST
async def model_reconfigure(request: HttpRequest, name: str) -> HttpResponse:
    """The Reconfigure form: the changed fields to POST .../reconfigure; the runtime's 422 / 400 /
    409 answers on the form as the Load form shows them."""
    try:
        entry = await _entry_or_404(name)
    except LLMPoolError as exc:
        return _action_error(request, name, exc)
    form = ReconfigureForm(entry, request.POST)
    answer, status, message = await _submitted(form, lambda: services.model_reconfigure(name, form.reconfigure_body()))
    ok = answer is not None
    if ok:
        entry = answer
        message = _reconfigured_message(name, entry.get("reconfigured") or {})
        form = ReconfigureForm(entry)
    if wants_json(request):
        html = await _residency_html(request, entry, form)
        return JsonResponse({"ok": ok, "message": message, "entry": entry, "residency_html": html}, status=status)
    if ok:
        messages.success(request, message)
        return redirect("llmpool_admin:model", name=name)
    return await _model_response(request, entry, LoadForm(entry), status, reconfigure_form=form)


def _reconfigured_message(name: str, done: dict) -> str:
    changed = done.get("changed") or {}
    if not changed:
        return f"{name}: nothing to change (the values are the effective ones)"
    parts = ", ".join(f"{key} {json.dumps(v['from'])} → {json.dumps(v['to'])}" for key, v in changed.items())
    mode = f" ({done['mode']})" if done.get("mode") else ""
    return f"{name} reconfigured in {done.get('duration_ms', 0):g} ms{mode}: {parts}"


def _action_error(request: HttpRequest, name: str, exc: LLMPoolError) -> HttpResponse:
    message = f"{exc.code}: {exc.message}"
    if wants_json(request):
        return JsonResponse({"ok": False, "message": message, "error": error_of(exc)}, status=exc.http_status)
    messages.error(request, message)
    return redirect("llmpool_admin:model", name=name)


# ---- GPU memory ------------------------------------------------------------------------------


@staff_view
async def gpu_page(request: HttpRequest) -> HttpResponse:
    try:
        memory, runtime_error = await selectors.gpu_memory(), None
    except LLMPoolError as exc:
        memory, runtime_error = {"gpus": [], "models": [], "error": None}, error_of(exc)
    context = {"memory": memory, "gpus": gpu_bars(memory["gpus"]), "runtime_error": runtime_error,
               "devices": device_bars(memory.get("devices") or [])}
    if request.GET.get("fragment") == "gpu":
        return TemplateResponse(request, "llmpool_admin/_gpu.html", context)
    return await render_page(request, "llmpool_admin/gpu.html", {**context, "title": "GPU memory"})


# ---- settings ----------------------------------------------------------------------------------


@staff_view
async def settings_page(request: HttpRequest) -> HttpResponse:
    """GET: the files and a Reload button; POST: reload and show the diff or why nothing changed."""
    result, error, status = None, None, 200
    if request.method == "POST":
        try:
            result = await services.settings_reload()
        except LLMPoolError as exc:
            error, status = error_of(exc), exc.http_status
    settings_path = Path(settings.LLMPOOL_SETTINGS)
    files = [
        {"path": str(path), "exists": path.exists()} for path in (settings_path, settings_path.with_name("local.json"))
    ]
    context = {"title": "Settings", "files": files, "result": result, "error": error}
    if result is not None:
        context["result_rows"] = [
            ("Added (start unloaded)", result["added_models"], "added", True),
            ("Removed", result["removed_models"], "removed", False),
            ("Updated", result["updated_models"], "updated", True),
            ("Unchanged", result["unchanged_models"], "unchanged", True),
        ]
    return await render_page(request, "llmpool_admin/settings.html", context, status)


# ---- activity --------------------------------------------------------------------------------


@staff_view
async def activity_page(request: HttpRequest) -> HttpResponse:
    """The Activity page; ``?fragment=json`` is what its script polls: the activity ring's newest
    requests, each device's memory and the models' entries (their load_progress)."""
    if request.GET.get("fragment") == "json":
        try:
            activity, memory, models = await asyncio.gather(
                selectors.activity(limit="200"), selectors.gpu_memory(), selectors.models_list()
            )
        except LLMPoolError as exc:
            return JsonResponse({"error": error_of(exc)}, status=503)
        progress = [{"name": m["name"], "load_progress": m.get("load_progress")} for m in models
                    if m["runtime_state"] == "loading"]
        devices = {f"cuda:{gpu['index']} used": gpu["used_mib"] for gpu in memory["gpus"]}
        for model in models:
            for device, mib in ((model.get("memory") or {}).get("charge_mib") or {}).items():
                devices[f"{device} charged"] = devices.get(f"{device} charged", 0) + (mib or 0)
        return JsonResponse({"requests": activity["requests"], "devices": devices, "loading": progress})
    return await render_page(request, "llmpool_admin/activity.html", {"title": "Activity"})
