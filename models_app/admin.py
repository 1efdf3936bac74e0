"""The Django admin: the read-only catalog mirror, and the site the workbench pages live in.

The workbench itself (models, one model, GPU memory, settings) is in
``workbench``; it calls the same services and selectors as the REST API.
"""
from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from models_app.models import CatalogModel

admin.site.site_header = "llm-pool administration"
admin.site.site_title = "llm-pool admin"
admin.site.index_title = "Operator's workbench"


@admin.register(CatalogModel)
class CatalogModelAdmin(admin.ModelAdmin):
    """Read-only: the catalog comes from settings.json + local.json, never from the admin."""

    list_display = ("name", "backend", "enabled", "sources", "updated_at", "live_page")
    list_filter = ("backend", "enabled")
    search_fields = ("name",)
    readonly_fields = ("name", "backend", "enabled", "definition", "sources", "updated_at", "live_page")

    @admin.display(description="live")
    def live_page(self, obj):
        return format_html('<a href="{}">live state, load / unload</a>', reverse("llmpool_admin:model", args=[obj.name]))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
