"""What every API endpoint shares: pagination, query-parameter parsing and allow-listed ordering."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

from portal.apps import MAX_ID

# An id query parameter, as filter_by_ids takes it.
ID = {"type": "integer", "format": "int64", "minimum": 1, "maximum": MAX_ID}


class PortalPagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 200

    def get_schema_operation_parameters(self, view):
        """DRF's page parameters with their bounds (a larger page_size is served max_page_size rows)."""
        page, page_size = super().get_schema_operation_parameters(view)
        page["schema"]["minimum"] = page_size["schema"]["minimum"] = 1
        page_size["schema"]["maximum"] = self.max_page_size
        return [page, page_size]


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
        if not 1 <= value <= MAX_ID:
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


def ordering_param(allowed: dict[str, str]) -> OpenApiParameter:
    """``?ordering=`` for the schema: a comma-separated list of the allowed names, each reversed by a leading -."""
    names = sorted(allowed)
    schema = {"type": "array", "items": {"type": "string", "enum": [*names, *(f"-{name}" for name in names)]}}
    return OpenApiParameter("ordering", schema, explode=False, description="A leading - reverses.")


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
