"""Kubernetes resource quantities (``500m``, ``1Gi``, ``4372Mi``) parsed to exact numbers and formatted back."""

from __future__ import annotations

import functools
import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Return the exact value of a quantity (``"1.5Gi"`` → bytes, ``"200m"`` → 0.2)."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return _parse_known(value)
    return _parse(value)  # anything else is refused with a QuantityError, never a TypeError


# A cluster's quantities are a handful of strings read over and over (every pod's requests, each time a namespace's
# quota usage is summed): remembered, they are parsed once. Decimals are immutable; errors are not remembered.
@functools.lru_cache(maxsize=4096, typed=True)
def _parse_known(value: str | int | float) -> Decimal:
    return _parse(value)


def _parse(value: object) -> Decimal:
    if isinstance(value, bool):
        raise QuantityError(f"quantities must match the regular expression: {value!r}")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise QuantityError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value!r}"
        )
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex already guards this
        raise QuantityError(str(value)) from exc
    suffix = match.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * (Decimal(10) ** int(suffix[1:]))


def format_cpu(cores: Decimal) -> str:
    """Format CPU cores the way the API server does: whole cores as integers, otherwise millicores."""
    millis = (cores * 1000).to_integral_value(rounding="ROUND_CEILING")
    if millis % 1000 == 0:
        return str(int(millis // 1000))
    return f"{int(millis)}m"


def format_memory(amount: Decimal) -> str:
    """Format bytes with the largest binary suffix that keeps the value whole (``4584374272`` → ``4372Mi``)."""
    value = int(amount.to_integral_value(rounding="ROUND_CEILING"))
    for suffix, factor in reversed(list(_BINARY.items())):
        if value and value % factor == 0:
            return f"{value // factor}{suffix}"
    return str(value)
