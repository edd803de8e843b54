"""Prepared statements a migration made stale ("cached plan must not change result type") are deallocated and run
again outside a transaction, instead of failing on that connection until the pool retires it."""

from __future__ import annotations

import logging
from typing import Any

from django.db import NotSupportedError

logger = logging.getLogger(__name__)

STALE_PLAN = "cached plan must not change result type"


def replan_stale_statements(execute, sql: str, params: Any, many: bool, context: dict[str, Any]):
    """A Django execute wrapper (``connection.execute_wrappers``) for PostgreSQL connections."""
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


def install(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: wrap every statement of a PostgreSQL connection."""
    if connection.vendor == "postgresql" and replan_stale_statements not in connection.execute_wrappers:
        connection.execute_wrappers.append(replan_stale_statements)
