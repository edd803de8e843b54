"""Prepared statements that a migration made stale are planned anew instead of failing until the process restarts.

psycopg prepares the queries a connection runs again and again (``DB_PREPARE_THRESHOLD``). When a migration changes
the type of a column such a query returns (a ``CharField``'s ``max_length`` is enough: ``varchar(20)`` to
``varchar(40)``), PostgreSQL refuses to run the prepared statement again: "cached plan must not change result
type". Inside a transaction the error ends it, and the rollback makes psycopg forget its prepared statements. Outside
one (autocommit, as most of the portal's reads run) nothing does: every process that was running while the
migration ran (old web, worker and beat processes during a rolling update) failed that query on that connection, on
every request, until the pool retired the connection an hour later.

Outside a transaction, the failed statement changed nothing: the connection's prepared statements are deallocated
(psycopg notices ``DEALLOCATE ALL`` and forgets them) and the statement runs once more, planned against the new
schema. Inside one (and for an ``executemany``), the error is raised as before.
"""

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
