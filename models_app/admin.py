from django.contrib import admin

from models_app.models import CatalogModel


@admin.register(CatalogModel)
class CatalogModelAdmin(admin.ModelAdmin):
    """Read-only: the catalog comes from settings.json + local.json, never from the admin."""

    list_display = ("name", "backend", "enabled", "sources", "updated_at")
    list_filter = ("backend", "enabled")
    search_fields = ("name",)
    readonly_fields = ("name", "backend", "enabled", "definition", "sources", "updated_at")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
