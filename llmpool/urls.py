"""Django's routes: the machine API's admin and discovery views, the OpenAPI document and its
UI, the metrics, and the admin pages.  The inference endpoints are not here: plain ASGI apps
serve them in front of Django (``models_app.api.routes``, wired in ``llmpool.asgi``)."""
from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from models_app.api import admin_keys, metrics, views

# POST /v1/admin/models/<name>/<operation>, each named admin-model-<operation>.
MODEL_OPERATIONS = {
    "load": views.ModelLoadApi,
    "unload": views.ModelUnloadApi,
    "reconfigure": views.ModelReconfigureApi,
    "sleep": views.ModelSleepApi,
    "wake": views.ModelWakeApi,
    "logs": views.ModelLogsApi,
}

urlpatterns = [
    path("v1/admin/models", views.ModelListApi.as_view(), name="admin-models"),
    *(path(f"v1/admin/models/<str:model_name>/{operation}", view.as_view(), name=f"admin-model-{operation}")
      for operation, view in MODEL_OPERATIONS.items()),
    path("v1/admin/gpu-memory", views.GpuMemoryApi.as_view(), name="admin-gpu-memory"),
    path("v1/admin/settings/reload", views.SettingsReloadApi.as_view(), name="admin-settings-reload"),
    path("v1/admin/activity", views.ActivityApi.as_view(), name="admin-activity"),
    path("v1/admin/keys", admin_keys.KeyListApi.as_view(), name="admin-keys"),
    path("v1/admin/keys/<str:key_id>", admin_keys.KeyDetailApi.as_view(), name="admin-key"),
    path("v1/admin/keys/<str:key_id>/usage", admin_keys.KeyUsageApi.as_view(), name="admin-key-usage"),
    path("v1/admin/events", views.AdminEventStreamApi.as_view(), name="admin-events"),
    path("v1/models", views.OpenAIModelListApi.as_view(), name="models"),
    path("v1/models/<str:model_id>", views.OpenAIModelApi.as_view(), name="model"),
    path("v1/openapi.json", SpectacularJSONAPIView.as_view(), name="openapi-schema"),
    re_path(r"^v1(?:/.*)?$", views.unknown_path, name="v1-not-found"),
    path("docs", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="swagger-ui"),
    path("healthz", views.HealthApi.as_view(), name="healthz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("admin/llm-pool/", include("models_app.workbench.urls")),
    path("admin/", admin.site.urls),
]
