"""WebSocket consumers: the lab page's socket (Start), live attempt events and the console bridge."""

from labs.consumers.console import AttemptConsoleConsumer
from labs.consumers.events import AttemptEventsConsumer
from labs.consumers.lab import LabEventsConsumer

__all__ = ["AttemptConsoleConsumer", "AttemptEventsConsumer", "LabEventsConsumer"]
