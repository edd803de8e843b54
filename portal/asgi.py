"""ASGI entry point: Django views over HTTP and the portal's WebSocket consumers, behind session auth and an
Origin check."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_asgi_app = get_asgi_application()

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import re_path  # noqa: E402

from labs.routing import websocket_urlpatterns  # noqa: E402
from portal.heap import freeze_startup_objects  # noqa: E402
from portal.websocket_auth import LazySessionAuthMiddlewareStack  # noqa: E402


class UnknownWebSocketPath(AsyncWebsocketConsumer):
    """Any other WebSocket path: refused at the handshake (daphne answers 403). Left to ``URLRouter``, it raised
    "No route found", which daphne logged with a traceback for every such request."""

    channel_layer_alias = None  # nothing is ever sent to it: no channel to wait on

    async def connect(self) -> None:
        await self.close()


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(LazySessionAuthMiddlewareStack(URLRouter(
            [*websocket_urlpatterns, re_path(r"", UnknownWebSocketPath.as_asgi())]
        ))),
    }
)
freeze_startup_objects()
