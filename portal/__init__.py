"""The lab portal's Django project and core domain: tenants, users, courses, memberships, audit."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
