"""Bearer-token protection of /v1/admin/* when service.admin_token is set."""
import hmac

from rest_framework.permissions import BasePermission

from models_app.conf import service_settings
from runtime.errors import AdminTokenRequired, Unauthorized


class AdminTokenPermission(BasePermission):
    def has_permission(self, request, view) -> bool:
        token = service_settings().admin_token
        if token is None:
            return True
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise Unauthorized("this endpoint requires Authorization: Bearer <service.admin_token>")
        return True


class AdminTokenConfigured(BasePermission):
    """The keys API needs service.admin_token set: open, anyone who reaches the port could make
    themselves an inference key, and the keys would guard nothing."""

    def has_permission(self, request, view) -> bool:
        if service_settings().admin_token is None:
            raise AdminTokenRequired(
                "managing inference keys needs service.admin_token set (or use manage.py create_api_key)"
            )
        return True
