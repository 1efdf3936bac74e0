from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from models_app import admin_views, apis

urlpatterns = [
    path("v1/admin/models", apis.ModelListApi.as_view(), name="admin-models"),
    path("v1/admin/models/<str:model_name>/load", apis.ModelLoadApi.as_view(), name="admin-model-load"),
    path("v1/admin/models/<str:model_name>/unload", apis.ModelUnloadApi.as_view(), name="admin-model-unload"),
    path("v1/admin/gpu-memory", apis.GpuMemoryApi.as_view(), name="admin-gpu-memory"),
    path("v1/admin/settings/reload", apis.SettingsReloadApi.as_view(), name="admin-settings-reload"),
    path("v1/admin/events", apis.AdminEventStreamApi.as_view(), name="admin-events"),
    path("v1/responses", apis.ResponseCreateApi.as_view(), name="responses"),
    path("v1/openapi.json", SpectacularJSONAPIView.as_view(), name="openapi-schema"),
    path("docs", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="swagger-ui"),
    path("healthz", apis.HealthApi.as_view(), name="healthz"),
    path("admin/llm-pool/", include(admin_views)),
    path("admin/", admin.site.urls),
]
