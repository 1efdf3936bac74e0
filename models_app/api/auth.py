"""Bearer-token protection of /v1/admin/* when service.admin_token is set."""
import hmac

from rest_framework.permissions import BasePermission

from models_app.conf import service_settings
from runtime.errors import Unauthorized


class AdminTokenPermission(BasePermission):
    def has_permission(self, request, view) -> bool:
        token = service_settings().admin_token
        if token is None:
            return True
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise Unauthorized("this endpoint requires Authorization: Bearer <service.admin_token>")
        return True
