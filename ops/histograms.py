"""Duration histograms for Prometheus: bucket counts, sum and count of timestamp spans, in one aggregate query."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.db.models import Aggregate, Case, Count, DurationField, ExpressionWrapper, F, Q, QuerySet, Sum, Value, When


def span(start: str, end: str) -> Case:
    """``end - start``, and 0 where ``end`` reads earlier than ``start``: the VMI's phase times come from the
    cluster in whole seconds (Kubernetes writes times without fractions), so a phase reached within the same second
    as the portal's precise ``provisioned_at`` reads up to a second before it. NULL where either is missing."""
    return Case(
        When(**{f"{end}__lt": F(start)}, then=Value(timedelta(0))),
        default=ExpressionWrapper(F(end) - F(start), output_field=DurationField()),
        output_field=DurationField(),
    )


def duration_histograms(
    queryset: QuerySet, *, spans: dict[str, tuple[str, str]], buckets: Iterable[float]
) -> dict[str, tuple[list[tuple[str, int]], float, int]]:
    """Bucket counts, sum and count of ``end - start`` per span, in one aggregate query.

    Returns ``{label: ([(le, cumulative count), ..., ("+Inf", count)], sum_seconds, count)}``.
    """
    buckets = tuple(buckets)
    aliases = {label: span(start, end) for label, (start, end) in spans.items()}
    aggregates: dict[str, Aggregate] = {}
    for label in spans:
        alias = f"d_{label}"
        aggregates[f"{label}__count"] = Count("pk", filter=Q(**{f"{alias}__isnull": False}))
        aggregates[f"{label}__sum"] = Sum(alias)
        for index, bound in enumerate(buckets):
            aggregates[f"{label}__le{index}"] = Count("pk", filter=Q(**{f"{alias}__lte": timedelta(seconds=bound)}))
    row = queryset.annotate(**{f"d_{label}": expression for label, expression in aliases.items()}).aggregate(
        **aggregates
    )
    result = {}
    for label in spans:
        count = row[f"{label}__count"] or 0
        total = row[f"{label}__sum"]
        series = [(_bucket_label(bound), row[f"{label}__le{index}"] or 0) for index, bound in enumerate(buckets)]
        series.append(("+Inf", count))
        result[label] = (series, total.total_seconds() if total else 0.0, count)
    return result


def _bucket_label(bound: float) -> str:
    return repr(float(bound))
