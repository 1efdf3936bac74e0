"""The workbench's routes: its pages under /admin/llm-pool/ and the live feed's WebSocket."""
from django.shortcuts import redirect
from django.urls import path

from models_app.workbench import keys, playground, views
from models_app.workbench.consumers import AdminEventsConsumer

app_name = "llmpool_admin"
urlpatterns = [
    path("", views.staff_view(lambda request: redirect("llmpool_admin:models")), name="index"),
    path("models/", views.models_page, name="models"),
    path("models/actions", views.models_action, name="models-action"),
    path("models/<str:name>/", views.model_page, name="model"),
    path("models/<str:name>/load", views.model_load, name="model-load"),
    path("models/<str:name>/unload", views.model_unload, name="model-unload"),
    path("models/<str:name>/sleep", views.model_residency, {"op": "sleep"}, name="model-sleep"),
    path("models/<str:name>/wake", views.model_residency, {"op": "wake"}, name="model-wake"),
    path("models/<str:name>/reconfigure", views.model_reconfigure, name="model-reconfigure"),
    path("models/<str:name>/logs", views.staff_view(playground.model_logs), name="model-logs"),
    path("gpu/", views.gpu_page, name="gpu"),
    path("activity/", views.activity_page, name="activity"),
    path("settings/", views.settings_page, name="settings"),
    path("keys/", keys.keys_page, name="keys"),
    path("keys/<str:key_id>/", keys.key_page, name="key"),
    path("keys/<str:key_id>/action", keys.key_action, name="key-action"),
]

# Served by llmpool.asgi behind the session login and the same-origin check.
websocket_urlpatterns = [path("admin/llm-pool/ws", AdminEventsConsumer.as_asgi())]
