"""Reading an enrollment CSV into validated rows, with every problem per line: UTF-8 (a BOM is fine), a header naming
``username,email,name,role`` in any order (Japanese names too), roles ``instructor``, ``ta`` or ``student``.
What the rows mean against the database is ``portal.enrollment_import``'s."""

from __future__ import annotations

import csv
import io
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from django.contrib.auth.base_user import BaseUserManager
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from portal.models import Role

MAX_FILE_BYTES = 2 * 1024 * 1024
MAX_ROWS = 5000
USERNAME_MAX_LENGTH = 150
EMAIL_MAX_LENGTH = 254
NAME_MAX_LENGTH = 200

COLUMNS = ("username", "email", "name", "role")
# Spellings of each column and role, compared after _fold.
COLUMN_ALIASES = {
    alias: column
    for column, aliases in {
        "username": ("username", "user", "login", "ユーザー名", "ユーザ名", "ユーザーid", "アカウント"),
        "email": ("email", "e-mail", "mail", "メール", "メールアドレス"),
        "name": ("name", "full name", "full_name", "氏名", "名前"),
        "role": ("role", "役割", "ロール"),
    }.items()
    for alias in aliases
}
ROLE_ALIASES = {
    alias: role
    for role, aliases in {
        Role.INSTRUCTOR: ("instructor", "teacher", "教員", "講師", "教師", "担当教員"),
        Role.TA: ("ta", "teaching assistant", "ティーチングアシスタント", "ティーエー"),
        Role.STUDENT: ("student", "学生", "受講生", "受講者", "生徒"),
    }.items()
    for alias in aliases
}


@dataclass(frozen=True)
class RowError:
    """One problem with the file; ``line`` is the physical line number (1 is the header), None for the file."""

    line: int | None
    message: str


@dataclass(frozen=True)
class EnrollmentRow:
    line: int
    username: str
    email: str
    full_name: str
    role: Role


class EnrollmentFileInvalid(Exception):
    """The file as a whole cannot be read; ``errors`` says where and why."""

    def __init__(self, line: int | None, message: str, *, earlier: list[RowError] | None = None) -> None:
        super().__init__(message)
        self.errors = [*(earlier or []), RowError(line, message)]


def _fold(text: str) -> str:
    """Header and role spellings compared without regard to width (ＴＡ), case or surrounding spaces."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise EnrollmentFileInvalid(
            line,
            _(
                "This line is not UTF-8 text. Save the file as “CSV UTF-8” (in Excel: Save As → CSV UTF-8) and "
                "upload it again."
            ),
        ) from exc


def _map_header(fields: list[str], *, line: int) -> dict[str, int]:
    positions: dict[str, int] = {}
    unknown: list[str] = []
    for index, raw in enumerate(fields):
        column = COLUMN_ALIASES.get(_fold(raw))
        if column is None:
            if raw.strip():
                unknown.append(raw.strip())
            continue
        if column in positions:
            raise EnrollmentFileInvalid(
                line, _("The column “%(column)s” appears twice in the header.") % {"column": column}
            )
        positions[column] = index
    missing = [column for column in COLUMNS if column not in positions]
    if missing or unknown:
        message = _("The first line must be the header username,email,name,role.")
        if missing:
            message += " " + _("Missing: %(columns)s.") % {"columns": ", ".join(missing)}
        if unknown:
            message += " " + _("Unknown: %(columns)s.") % {"columns": ", ".join(unknown)}
        raise EnrollmentFileInvalid(line, message)
    return positions


def _passes(validator: Callable[[str], None], text: str) -> bool:
    try:
        validator(text)
    except ValidationError:
        return False
    return True


def _check_row(values: dict[str, str], *, line: int, errors: list[RowError]) -> EnrollmentRow | None:
    problems: list[str] = []
    # Django stores usernames NFKC-normalised (AbstractBaseUser.normalize_username); compare what will be stored.
    username = unicodedata.normalize("NFKC", values["username"])
    email = values["email"]
    full_name = values["name"]
    role_text = values["role"]

    if not username:
        problems.append(_("the username is missing"))
    elif len(username) > USERNAME_MAX_LENGTH:
        problems.append(_("the username is longer than %(max)d characters") % {"max": USERNAME_MAX_LENGTH})
    elif not _passes(UnicodeUsernameValidator(), username):
        problems.append(
            _("the username “%(username)s” may contain only letters, digits and @ . + - _") % {"username": username}
        )

    if not email:
        problems.append(_("the email address is missing"))
    elif len(email) > EMAIL_MAX_LENGTH or not _passes(validate_email, email):
        problems.append(_("“%(email)s” is not a valid email address") % {"email": email})
    else:
        email = BaseUserManager.normalize_email(email)

    if not full_name:
        problems.append(_("the name is missing"))
    elif len(full_name) > NAME_MAX_LENGTH:
        problems.append(_("the name is longer than %(max)d characters") % {"max": NAME_MAX_LENGTH})

    role = ROLE_ALIASES.get(_fold(role_text)) if role_text else None
    if not role_text:
        problems.append(_("the role is missing"))
    elif role is None:
        problems.append(_("the role “%(role)s” is not one of instructor, ta, student") % {"role": role_text})

    if problems or role is None:  # a row without a known role has a problem saying so
        errors.append(RowError(line, "; ".join(problems)))
        return None
    return EnrollmentRow(line=line, username=username, email=email, full_name=full_name, role=role)


def enrollment_rows_read(csv_file: IO[bytes] | bytes) -> tuple[list[EnrollmentRow], list[RowError]]:
    """The good rows and the other rows' problems; a problem of the whole file raises ``EnrollmentFileInvalid``."""
    # One byte past the limit tells "too big" from "exactly at the limit" without reading a huge upload.
    data = csv_file if isinstance(csv_file, bytes) else csv_file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise EnrollmentFileInvalid(
            None, _("The file is larger than %(size)d MB; split it.") % {"size": MAX_FILE_BYTES // (1024 * 1024)}
        )
    reader = csv.reader(io.StringIO(_decode(data), newline=""), strict=True)
    errors: list[RowError] = []
    rows: list[EnrollmentRow] = []
    positions: dict[str, int] | None = None
    header_width = 0
    first_line_by_username: dict[str, int] = {}
    start_line = 1
    data_rows = 0
    try:
        for fields in reader:
            line, start_line = start_line, reader.line_num + 1
            if not any(field.strip() for field in fields):
                continue
            if positions is None:
                positions = _map_header(fields, line=line)
                # Spreadsheets often leave empty trailing columns; only what the header names is read.
                header_width = max(positions.values()) + 1
                continue
            data_rows += 1
            if data_rows > MAX_ROWS:
                raise EnrollmentFileInvalid(
                    line, _("The file has more than %(max)d rows; split it.") % {"max": MAX_ROWS}
                )
            if len(fields) < header_width or any(field.strip() for field in fields[header_width:]):
                message = ngettext(
                    "expected %(expected)d value as in the header, found %(found)d",
                    "expected %(expected)d values as in the header, found %(found)d",
                    header_width,
                )
                errors.append(RowError(line, message % {"expected": header_width, "found": len(fields)}))
                continue
            values = {column: fields[index].strip() for column, index in positions.items()}
            row = _check_row(values, line=line, errors=errors)
            if row is None:
                continue
            key = row.username.casefold()
            if key in first_line_by_username:
                message = _("the username “%(username)s” already appears on line %(line)d")
                errors.append(RowError(line, message % {"username": row.username, "line": first_line_by_username[key]}))
                continue
            first_line_by_username[key] = line
            rows.append(row)
    except csv.Error as exc:
        raise EnrollmentFileInvalid(
            reader.line_num, _("This line is not valid CSV: %(error)s") % {"error": exc}, earlier=errors
        ) from exc

    if positions is None and not errors:
        raise EnrollmentFileInvalid(
            None, _("The file is empty. The first line must be the header username,email,name,role.")
        )
    if positions is not None and data_rows == 0 and not errors:
        raise EnrollmentFileInvalid(None, _("The file has a header but no people."))
    return rows, errors
