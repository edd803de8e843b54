"""Secret fields in the admin: an attempt's agent token, a password hash, an API token's key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest

# Fields that hold a secret (an attempt's agent token, a password hash, an API token's key): no admin lists,
# searches or filters on them, and a filter on one in the address is refused (400).
SECRET_FIELDS = frozenset({"agent_token", "password", "key"})


if TYPE_CHECKING:
    _AdminBase = admin.ModelAdmin[Any]
else:
    _AdminBase = object


class SecretFieldsHiddenMixin(_AdminBase):
    """Refuses any changelist lookup that goes through a secret field, however it is spelled
    (``?agent_token__startswith=K`` would give a token away one character at a time)."""

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if SECRET_FIELDS.intersection(lookup.split(LOOKUP_SEP)):
            return False
        return super().lookup_allowed(lookup, value, request)
