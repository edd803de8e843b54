"""Settings for the lab portal, read from the environment once, in this package. With nothing set it runs embedded
(SQLite, in-memory channel layer and Celery, kubesim); ``PORTAL_ENV=production`` refuses to start without its
secrets."""

from portal.settings.base import *
from portal.settings.lifecycle import *
from portal.settings.stores import *
from portal.settings.web import *
from portal.settings.workers import *
