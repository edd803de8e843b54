"""App configuration for the portal's core domain, the ``<id:...>`` path converter and stale-plan recovery."""

import logging
from typing import Any

from django.apps import AppConfig
from django.db import NotSupportedError
from django.urls.converters import IntConverter
from django.utils.translation import gettext_lazy as _

logger = logging.getLogger(__name__)

# The largest value of a BigAutoField (a signed 64-bit integer): a larger number is no row of ours, and SQLite
# raises OverflowError for it instead of finding nothing.
MAX_ID = 2**63 - 1


class IdConverter(IntConverter):
    """Ids in URLs (``<id:attempt_id>``): digits that fit a database id, else no match (404)."""

    regex = "[0-9]{1,19}"

    def to_python(self, value: str) -> int:
        number = int(value)
        if number > MAX_ID:
            raise ValueError(f"{value} is larger than any id")  # Django's resolver takes this as no match
        return number


# Prepared statements a migration made stale are deallocated and run again outside a transaction, instead of
# failing on that connection until the pool retires it.
STALE_PLAN = "cached plan must not change result type"


def replan_stale_statements(execute, sql: str, params: Any, many: bool, context: dict[str, Any]):
    try:
        return execute(sql, params, many, context)
    except NotSupportedError as error:
        connection = context["connection"]
        if (
            STALE_PLAN not in str(error)
            or many  # an executemany may have run some of its rows already
            or connection.in_atomic_block
            or not connection.get_autocommit()
        ):
            raise
        logger.warning("A prepared statement no longer matches the schema (a migration ran); planning anew")
        connection.connection.execute("DEALLOCATE ALL")
        return execute(sql, params, many, context)


def replan_on_postgresql(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor == "postgresql" and replan_stale_statements not in connection.execute_wrappers:
        connection.execute_wrappers.append(replan_stale_statements)


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = _("Portal")

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.db.models.signals import pre_save
        from django.urls import register_converter

        from portal import ratelimit, websockets  # noqa: F401 (their receivers: failed sign-ins, signing out)
        from portal.models import User
        from portal.services import revoke_on_credentials_change

        register_converter(IdConverter, "id")  # before any URLconf is loaded

        connection_created.connect(replan_on_postgresql, dispatch_uid="portal.prepared")
        pre_save.connect(revoke_on_credentials_change, sender=User, dispatch_uid="portal.api_tokens")
