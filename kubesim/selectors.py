"""Label and field selectors with the syntax and semantics of the Kubernetes API server."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Requirement = Callable[[dict[str, str]], bool]

_SET_BASED = re.compile(r"^\s*(!?)([A-Za-z0-9./_-]+)\s*(?:\s(in|notin)\s*\(([^)]*)\))?\s*$")
_EQUALITY = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")


class SelectorError(ValueError):
    """A selector string that does not parse; the server answers 400 BadRequest."""


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside the parentheses of an ``in (...)`` set."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part for part in parts if part.strip()]


def _label_requirement(term: str) -> Requirement:
    equality = _EQUALITY.match(term)
    if equality:
        key, operator, value = equality.groups()
        if operator == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    set_based = _SET_BASED.match(term)
    if not set_based:
        raise SelectorError(f"unable to parse requirement: {term.strip()!r}")
    negated, key, operator, values = set_based.groups()
    if operator:
        if negated:
            raise SelectorError(f"unable to parse requirement: {term.strip()!r}")
        allowed = {value.strip() for value in values.split(",") if value.strip()}
        if operator == "in":
            return lambda labels: labels.get(key) in allowed
        return lambda labels: labels.get(key) not in allowed
    if negated:
        return lambda labels: key not in labels
    return lambda labels: key in labels


@dataclass(frozen=True)
class LabelSelector:
    """A parsed ``labelSelector`` query parameter."""

    requirements: tuple[Requirement, ...]

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text:
            return cls(())
        return cls(tuple(_label_requirement(term) for term in _split_top_level(text)))

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        return all(requirement(labels) for requirement in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _field_value(obj: dict[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


@dataclass(frozen=True)
class FieldSelector:
    """A parsed ``fieldSelector``: ``=``, ``==`` and ``!=`` terms on the fields a resource supports."""

    terms: tuple[tuple[str, bool, str], ...]

    @classmethod
    def parse(cls, text: str | None, *, supported: frozenset[str]) -> FieldSelector:
        if not text:
            return cls(())
        terms = []
        for term in _split_top_level(text):
            match = _EQUALITY.match(term)
            if not match:
                raise SelectorError(f"invalid selector: {text!r}; can't understand {term.strip()!r}")
            field, operator, value = match.groups()
            if field not in supported:
                raise SelectorError(f"field label not supported: {field}")
            terms.append((field, operator != "!=", value))
        return cls(tuple(terms))

    def matches(self, obj: dict[str, Any]) -> bool:
        return all((_field_value(obj, field) == value) == wanted for field, wanted, value in self.terms)

    def exact_name(self) -> str | None:
        """The name when the selector pins ``metadata.name`` (what ``kubectl delete --wait`` sends)."""
        for field, wanted, value in self.terms:
            if field == "metadata.name" and wanted:
                return value
        return None

    @property
    def empty(self) -> bool:
        return not self.terms
