"""``{% playground entry %}`` and ``{% log_pane entry %}``: the model page's playground and live
log pane (models_app/workbench/playground.py), each rendered from the model's live entry."""
from django import template
from django.urls import reverse

from models_app.workbench.playground import playground_context

register = template.Library()


@register.inclusion_tag("llmpool_admin/_playground.html")
def playground(entry: dict) -> dict:
    return {"entry": entry, **playground_context(entry)}


@register.inclusion_tag("llmpool_admin/_log_pane.html")
def log_pane(entry: dict) -> dict:
    return {"entry": entry, "logs_url": reverse("llmpool_admin:model-logs", args=[entry["name"]])}
