"""The path converter for ids in URLs (``<id:attempt_id>``): digits that fit a database id, else no match (404)."""

from __future__ import annotations

# The largest value of a BigAutoField (a signed 64-bit integer): a larger number is no row of ours, and SQLite
# raises OverflowError for it instead of finding nothing.
MAX_ID = 2**63 - 1


class IdConverter:
    regex = "[0-9]{1,19}"

    def to_python(self, value: str) -> int:
        number = int(value)
        if number > MAX_ID:
            raise ValueError(f"{value} is larger than any id")  # Django's resolver takes this as no match
        return number

    def to_url(self, value: int) -> str:
        return str(int(value))
