"""The gradebook as CSV rows, with cells a spreadsheet shows as text and never evaluates."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

from django.utils.translation import gettext as _

from grading.selectors.reports import course_gradebook
from portal.models import Course

# Characters that make spreadsheet programs read a cell as a formula (OWASP "CSV injection"), with the
# full-width forms that Japanese input methods produce.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "\n", "＝", "＋", "－", "＠")


def csv_text(value: object) -> str:
    """A text cell that a spreadsheet shows as text, never evaluates."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


def _csv_number(value: Decimal | None) -> str:
    return "" if value is None else f"{value:.2f}"


def gradebook_csv_rows(*, course: Course) -> Iterator[list[str]]:
    """The gradebook as rows: identity columns, then per lab its final score and its flags, then the total."""
    book = course_gradebook(course=course)
    header = [_("Username"), _("Full name"), _("Email")]
    for lab in book.labs:
        title = csv_text(lab.title)
        header += [f"{title} (/{_csv_number(lab.max_points or Decimal(0))})", _("%(lab)s: flags") % {"lab": title}]
    header.append(_("Total (/%(max)s)") % {"max": _csv_number(book.max_total)})
    yield header
    late, overridden = _("late"), _("override")
    for row in book.rows:
        cells = [csv_text(row.student.username), csv_text(row.student.full_name), csv_text(row.student.email)]
        for cell in row.cells:
            flags = [flag for flag, on in ((late, cell.late), (overridden, cell.overridden)) if on]
            cells += [_csv_number(cell.final), " ".join(flags)]
        cells.append(_csv_number(row.total))
        yield cells
