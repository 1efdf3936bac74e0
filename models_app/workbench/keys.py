"""The workbench's key pages: every inference key, a page per key, and the writes on them.

They go through the same ``services`` and ``selectors`` as the keys API (/v1/admin/keys), and
call ``keys.forget`` after a write as it does, so a change takes effect on this API process at
once and on every other within a second.  The keys page lists the keys of settings.json (read-only)
and of the database and makes a key, whose secret the page answering the creation shows that
once; a key's page shows its models, limits, budget and usage (tokens per day of the last
``USAGE_DAYS`` days, as a small bar chart drawn here as SVG) and disables, enables or deletes it.
"""
from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from models_app import selectors, services
from models_app.api import keys
from models_app.api.admin_keys import usage_json
from models_app.conf import service_settings
from models_app.key_fields import DATABASE_ID_PREFIX, LIMIT_FIELDS, database_id, row_json, settings_key_json
from models_app.workbench.views import error_of, render_page, staff_view
from runtime.errors import LLMPoolError

USAGE_DAYS = 30
CHART_HEIGHT = 80  # px of the usage chart's tallest bar
_INTEGER_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent", "token_budget")
_NUMBER_FIELDS = ("weight", "queue_timeout_seconds")


def form_fields(form) -> dict:
    """A key's fields from the create form: a blank field is null (no limit), ``models`` is ``*``
    or names separated by commas; what is not a number stays text, for the key's schema to refuse."""
    fields = {"name": form.get("name", "").strip()}
    listed = [name.strip() for name in form.get("models", "*").split(",") if name.strip()]
    fields["models"] = "*" if listed in ([], ["*"]) else listed
    for name in _INTEGER_FIELDS:
        raw = form.get(name, "").strip()
        # Past 18 digits it stays text (the schema refuses it): int() refuses 4,300 digits and more.
        fields[name] = None if not raw else int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else raw
    for name in _NUMBER_FIELDS:
        raw = form.get(name, "").strip()
        try:
            fields[name] = float(raw) if raw else None
        except ValueError:
            fields[name] = raw
    fields["budget_period"] = form.get("budget_period") or None
    fields["priority"] = form.get("priority") or "default"
    fields["fairness_key"] = form.get("fairness_key", "").strip() or None
    return fields


@staff_view
async def keys_page(request: HttpRequest) -> HttpResponse:
    """The keys, and the create form (POST: make a key; the answer shows its secret once)."""
    created, error, status = None, None, 200
    if request.method == "POST":
        try:
            fields = services.validated_key_fields(form_fields(request.POST))
            row, secret = await sync_to_async(services.key_create)(fields=fields)
            keys.forget()
            created = {**row_json(row), "key": secret}
            status = 201
        except LLMPoolError as exc:
            error, status = error_of(exc), exc.http_status
    rows = await sync_to_async(selectors.key_list)()
    listed = [settings_key_json(key) for key in service_settings().api_keys] + [row_json(row) for row in rows]
    context = {"title": "Inference keys", "keys": listed, "created": created, "error": error,
               "form": request.POST if error else {}}
    return await render_page(request, "llmpool_admin/keys.html", context, status)


async def _row(key_id: str):
    number = key_id.removeprefix(DATABASE_ID_PREFIX)
    if not key_id.startswith(DATABASE_ID_PREFIX) or not number.isascii() or not number.isdigit() or len(number) > 18:
        raise Http404(f"no key {key_id}")
    row = await sync_to_async(selectors.key_get)(int(number))
    if row is None:
        raise Http404(f"no key {key_id}")
    return row


@staff_view
async def key_page(request: HttpRequest, key_id: str) -> HttpResponse:
    row = await _row(key_id)
    since = datetime.now(timezone.utc).date() - timedelta(days=USAGE_DAYS - 1)
    usage = await usage_json(row, row.pk, await sync_to_async(selectors.key_usage)(row.pk, since), since)
    shown = row_json(row)
    context = {"title": f"Key {row.name}", "key": shown, "usage": usage,
               "limits": [(name, shown[name]) for name in LIMIT_FIELDS], "chart": usage_chart(usage, since)}
    return await render_page(request, "llmpool_admin/key.html", context)


@staff_view
@require_POST
async def key_action(request: HttpRequest, key_id: str) -> HttpResponse:
    """Disable, enable or delete the key (the form's ``action``), then back to its page or the list."""
    row = await _row(key_id)
    action = request.POST.get("action")
    if action in ("disable", "enable"):
        await sync_to_async(services.key_update)(pk=row.pk, changes={"disabled": action == "disable"})
        keys.forget()
        messages.success(request, f"The key {row.name} is {action}d.")
        return redirect("llmpool_admin:key", key_id=database_id(row.pk))
    if action == "delete":
        await sync_to_async(services.key_delete)(pk=row.pk)
        keys.forget()
        messages.success(request, f"The key {row.name} is deleted.")
        return redirect("llmpool_admin:keys")
    raise Http404(f"no action {action!r}")


def usage_chart(usage: dict, since: date) -> dict:
    """The usage chart's bars: one per day since ``since`` (today last), input and output stacked,
    heights in px of ``CHART_HEIGHT`` for the busiest day."""
    per_day: dict[str, list[int]] = {}
    for row in usage["days"]:
        counts = per_day.setdefault(row["day"], [0, 0])
        counts[0] += row["input_tokens"]
        counts[1] += row["output_tokens"]
    days = [(since + timedelta(days=offset)).isoformat() for offset in range(USAGE_DAYS)]
    busiest = max((sum(per_day.get(day, [0, 0])) for day in days), default=0) or 1
    bars = []
    for index, day in enumerate(days):
        tokens_in, tokens_out = per_day.get(day, [0, 0])
        height_in = round(CHART_HEIGHT * tokens_in / busiest)
        height_out = round(CHART_HEIGHT * (tokens_in + tokens_out) / busiest) - height_in
        bars.append({"day": day, "input": tokens_in, "output": tokens_out, "x": index * 12,
                     "in_y": CHART_HEIGHT - height_in, "in_height": height_in,
                     "out_y": CHART_HEIGHT - height_in - height_out, "out_height": height_out})
    return {"bars": bars, "width": USAGE_DAYS * 12, "height": CHART_HEIGHT}
