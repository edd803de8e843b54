"""What every API endpoint shares: pagination, query-parameter parsing and allow-listed ordering."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils.translation import gettext as _
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request


class PortalPagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 200


def filter_by_ids(queryset: QuerySet, request: Request, params: dict[str, str]) -> QuerySet:
    """Filter by each optional id query parameter given (name -> model path); one not a positive integer is a 400."""
    for name, path in params.items():
        raw = request.query_params.get(name)
        if not raw:
            continue
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if not 1 <= value <= 2**63 - 1:
            raise ValidationError({name: [_("Give a whole number.")]})
        queryset = queryset.filter(**{path: value})
    return queryset


def choice_param(request: Request, name: str, choices: list[str] | tuple[str, ...]) -> str | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if raw not in choices:
        raise ValidationError({name: [_("Choose one of: %(choices)s.") % {"choices": ", ".join(choices)}]})
    return raw


def ordered(queryset: QuerySet, request: Request, *, allowed: dict[str, str], default: list[str]) -> QuerySet:
    """Order by ``?ordering=name,-other``, each name allow-listed (public name -> model path) so that ordering never
    reaches ``tenant`` or another tenant's rows through a relation; ``id`` breaks ties so pages are stable."""
    raw = request.query_params.get("ordering")
    if not raw:
        return queryset.order_by(*default)
    fields: list[str] = []
    for item in raw.split(","):
        item = item.strip()
        descending = item.startswith("-")
        name = item[1:] if descending else item
        if name not in allowed:
            raise ValidationError(
                {"ordering": [_("Order by one of: %(choices)s.") % {"choices": ", ".join(sorted(allowed))}]}
            )
        fields.append(("-" if descending else "") + allowed[name])
    if not any(field.lstrip("-") == "id" for field in fields):
        fields.append("id")
    return queryset.order_by(*fields)
