"""Writes of the core domain: the audit log."""

from __future__ import annotations

from typing import Any

from django.db import models

from portal.models import AuditEvent, Course, Tenant, User


def audit_record(
    *,
    actor: User | None,
    action: str,
    target: models.Model | None = None,
    tenant: Tenant | None = None,
    course: Course | None = None,
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Record a state change made by a person. Call inside the transaction that makes the change."""
    return AuditEvent.objects.create(
        tenant=tenant,
        course=course,
        actor=actor if actor is not None and actor.is_authenticated else None,
        action=action,
        target_type=target._meta.label if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:300] if target is not None else "",
        data=data or {},
    )
