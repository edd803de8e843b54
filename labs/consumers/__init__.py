"""WebSocket consumers: live attempt events and the console bridge."""

from labs.consumers.console import AttemptConsoleConsumer
from labs.consumers.events import AttemptEventsConsumer

__all__ = ["AttemptConsoleConsumer", "AttemptEventsConsumer"]
