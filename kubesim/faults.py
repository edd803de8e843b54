"""Injected faults and request counters, driven through the admin endpoints and the serve flags."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kubesim.errors import ApiError

_ERROR_MESSAGES = {
    500: "Internal error occurred: injected by kubesim",
    503: "the server is currently unable to handle the request (injected by kubesim)",
    429: "Too many requests, please try again later.",
}


# Who kubesim says is asking when it refuses as RBAC would: the portal's service account in deploy/rbac.yaml.
RBAC_USER = "system:serviceaccount:lab-portal:lab-portal"


def rbac_refusal(verb: str, resource: str, *, group: str, namespace: str, name: str, user: str = RBAC_USER) -> str:
    """The API server's 403 text when RBAC grants no rule (``k8s.io/apiserver`` ``forbiddenMessage``)."""
    plural, _slash, subresource = resource.partition("/")
    qualified = f"{plural}.{group}" if group else plural
    what = f'{qualified} "{name}"' if name else qualified
    resource_text = f'resource "{plural}/{subresource}"' if subresource else f'resource "{plural}"'
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    return f'{what} is forbidden: User "{user}" cannot {verb} {resource_text} in API group "{group}"{where}'


@dataclass
class ErrorRule:
    """Answer ``code`` to a fraction ``rate`` of the matching requests (optionally only ``count`` times)."""

    code: int
    rate: float = 1.0
    verbs: frozenset[str] | None = None
    resources: frozenset[str] | None = None
    retry_after: int | None = None  # seconds; 429 always carries one (1 unless set), 503 only when set
    count: int | None = None
    namespaces: frozenset[str] | None = None

    def matches(self, verb: str, resource: str, namespace: str = "") -> bool:
        return (
            (self.verbs is None or verb in self.verbs)
            and (self.resources is None or resource in self.resources or resource.split("/")[0] in self.resources)
            and (self.namespaces is None or namespace in self.namespaces)
        )

    def describe(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "rate": self.rate,
            "verbs": sorted(self.verbs) if self.verbs else None,
            "resources": sorted(self.resources) if self.resources else None,
            "retry_after": self.retry_after,
            "count": self.count,
            "namespaces": sorted(self.namespaces) if self.namespaces else None,
        }


def _names(value: Any) -> frozenset[str] | None:
    if value in (None, "", "*", []):
        return None
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    return frozenset(str(v) for v in value)


@dataclass
class Faults:
    """What is currently injected."""

    latency: dict[str, float] = field(default_factory=dict)  # "verb" or "verb:resource" or "*" → seconds
    errors: list[ErrorRule] = field(default_factory=list)
    watch_drop_after: float | None = None  # every watch stream is cut after this many seconds
    console_drop_after: float | None = None  # every console session is cut (1006) after this many seconds
    rng: random.Random = field(default_factory=random.Random)

    def update(self, spec: dict[str, Any]) -> None:
        """Add to the current faults from an admin request body (see README, "Admin API")."""
        if not isinstance(spec, dict):
            raise ApiError(400, "fault specification must be a JSON object")
        for key, value in (spec.get("latency") or {}).items():
            try:
                self.latency[str(key)] = float(value)
            except (TypeError, ValueError) as exc:
                raise ApiError(400, f"latency for {key!r} must be a number of seconds") from exc
        for rule in spec.get("errors") or ():
            try:
                code = int(rule["code"])
                if code not in (403, 429, 500, 503):
                    raise ValueError("code must be 403, 429, 500 or 503")
                rate = float(rule.get("rate", 1.0))
                if not 0.0 <= rate <= 1.0:
                    raise ValueError("rate must be between 0 and 1")
                self.errors.append(
                    ErrorRule(
                        code=code,
                        rate=rate,
                        verbs=_names(rule.get("verbs")),
                        resources=_names(rule.get("resources")),
                        retry_after=int(rule["retry_after"]) if rule.get("retry_after") is not None else None,
                        count=int(rule["count"]) if rule.get("count") is not None else None,
                        namespaces=_names(rule.get("namespaces")),
                    )
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ApiError(400, f"invalid error rule {rule!r}: {exc}") from exc
        for key in ("watch_drop_after", "console_drop_after"):
            if key in spec:
                value = spec[key]
                setattr(self, key, float(value) if value is not None else None)

    def clear(self) -> None:
        self.latency.clear()
        self.errors.clear()
        self.watch_drop_after = None
        self.console_drop_after = None

    def describe(self) -> dict[str, Any]:
        return {
            "latency": dict(self.latency),
            "errors": [rule.describe() for rule in self.errors],
            "watch_drop_after": self.watch_drop_after,
            "console_drop_after": self.console_drop_after,
        }

    def latency_for(self, verb: str, resource: str) -> float:
        return self.latency.get(f"{verb}:{resource}", self.latency.get(verb, self.latency.get("*", 0.0)))

    def error_for(
        self, verb: str, resource: str, *, group: str = "", namespace: str = "", name: str = ""
    ) -> ApiError | None:
        for rule in self.errors:
            if not rule.matches(verb, resource, namespace) or rule.count == 0:
                continue
            if rule.rate < 1.0 and self.rng.random() >= rule.rate:
                continue
            if rule.count is not None:
                rule.count -= 1
            retry_after = rule.retry_after if rule.retry_after is not None else (1 if rule.code == 429 else None)
            headers = {"Retry-After": str(retry_after)} if retry_after is not None and rule.code != 500 else {}
            details = {"retryAfterSeconds": retry_after} if headers else None
            if rule.code == 403:
                return ApiError(403, rbac_refusal(verb, resource, group=group, namespace=namespace, name=name))
            return ApiError(rule.code, _ERROR_MESSAGES[rule.code], details=details, headers=headers)
        return None


class RequestCounters:
    """API requests by verb and resource since the last reset (watches count once, when opened)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.by_verb_resource: Counter[tuple[str, str]] = Counter()
        self.watch_events = 0
        self.since = time.time()

    def count(self, verb: str, resource: str) -> None:
        self.by_verb_resource[(verb, resource)] += 1

    def snapshot(self, *, open_watches: int, open_consoles: int, open_portforwards: int) -> dict[str, Any]:
        by_verb: Counter[str] = Counter()
        by_resource: Counter[str] = Counter()
        for (verb, resource), count in self.by_verb_resource.items():
            by_verb[verb] += count
            by_resource[resource] += count
        return {
            "total": sum(self.by_verb_resource.values()),
            "by_verb": dict(by_verb),
            "by_resource": dict(by_resource),
            "by_verb_resource": {
                f"{verb} {resource}": count for (verb, resource), count in sorted(self.by_verb_resource.items())
            },
            "watch_events_sent": self.watch_events,
            "open_watches": open_watches,
            "open_consoles": open_consoles,
            "open_portforwards": open_portforwards,
            "since": self.since,
            "elapsed_seconds": time.time() - self.since,
        }
