"""ASGI entry point (``ASGI_APPLICATION``): Django's views over HTTP behind the request body bound, and every app's
WebSocket routes behind session auth and an Origin check. It lives in ``ops``, the layer above the apps it composes."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from grading.routing import websocket_urlpatterns as grading_routes  # noqa: E402
from labs.routing import websocket_urlpatterns as labs_routes  # noqa: E402
from portal.heap import freeze_startup_objects  # noqa: E402
from portal.request_bounds import RequestBodyLimit  # noqa: E402
from portal.websockets import websocket_gate  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": RequestBodyLimit(django_asgi_app),
        "websocket": websocket_gate([*labs_routes, *grading_routes]),
    }
)
freeze_startup_objects()
