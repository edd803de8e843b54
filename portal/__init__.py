"""The lab portal's Django project and core domain: tenants, users, courses, memberships, audit."""

from portal.celery import app as celery_app  # noqa: F401 (loaded with Django, so that tasks bind to it)
