from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerView

from models_app.api import admin_keys, metrics, views

urlpatterns = [
    path("v1/admin/models", views.ModelListApi.as_view(), name="admin-models"),
    path("v1/admin/models/<str:model_name>/load", views.ModelLoadApi.as_view(), name="admin-model-load"),
    path("v1/admin/models/<str:model_name>/unload", views.ModelUnloadApi.as_view(), name="admin-model-unload"),
    path("v1/admin/models/<str:model_name>/reconfigure", views.ModelReconfigureApi.as_view(),
         name="admin-model-reconfigure"),
    path("v1/admin/models/<str:model_name>/sleep", views.ModelSleepApi.as_view(), name="admin-model-sleep"),
    path("v1/admin/models/<str:model_name>/wake", views.ModelWakeApi.as_view(), name="admin-model-wake"),
    path("v1/admin/models/<str:model_name>/logs", views.ModelLogsApi.as_view(), name="admin-model-logs"),
    path("v1/admin/gpu-memory", views.GpuMemoryApi.as_view(), name="admin-gpu-memory"),
    path("v1/admin/settings/reload", views.SettingsReloadApi.as_view(), name="admin-settings-reload"),
    path("v1/admin/activity", views.ActivityApi.as_view(), name="admin-activity"),
    path("v1/admin/keys", admin_keys.KeyListApi.as_view(), name="admin-keys"),
    path("v1/admin/keys/<str:key_id>", admin_keys.KeyDetailApi.as_view(), name="admin-key"),
    path("v1/admin/events", views.AdminEventStreamApi.as_view(), name="admin-events"),
    path("v1/responses", views.ResponseCreateApi.as_view(), name="responses"),
    path("v1/chat/completions", views.ChatCompletionCreateApi.as_view(), name="chat-completions"),
    path("v1/completions", views.CompletionCreateApi.as_view(), name="completions"),
    path("v1/embeddings", views.EmbeddingCreateApi.as_view(), name="embeddings"),
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
