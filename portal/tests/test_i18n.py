"""Japanese: pages render in Japanese when the browser or the language switcher asks for it, and the ja catalogue
is complete (no untranslated or fuzzy entry, placeholders kept) and compiled into the committed .mo."""

from __future__ import annotations

import ast
import gettext
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

from labs.models import Attempt, AttemptState

LC_MESSAGES = Path(settings.BASE_DIR) / "locale" / "ja" / "LC_MESSAGES"
DOMAINS = ["django", "djangojs"]
# Python-format placeholders and str.format fields: a translation must carry exactly the ones of its source.
PLACEHOLDER = re.compile(r"%\([^)]+\)[sdifr]|%[sdifr%]|\{[0-9a-z_]*\}")
TAG = re.compile(r"</?[a-zA-Z][^>]*>")


@dataclass
class Entry:
    line: int
    msgctxt: str | None = None
    msgid: str = ""
    msgid_plural: str | None = None
    msgstr: dict[int, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)


def parse_po(path: Path) -> list[Entry]:
    """The catalogue's live entries (obsolete #~ entries left out), strings unescaped as gettext reads them."""
    entries: list[Entry] = []
    current: Entry | None = None
    target: tuple[str, int | None] | None = None

    def start(line_number: int) -> Entry:
        nonlocal current
        if current is None:
            current = Entry(line=line_number)
            entries.append(current)
        return current

    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line:
            current, target = None, None
            continue
        if line.startswith("#,"):
            start(number).flags.update(flag.strip() for flag in line[2:].split(","))
            continue
        if line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        if line.startswith('"'):
            keyword, rest = "", line
        text = ast.literal_eval(rest) if rest else ""
        entry = start(number)
        if keyword == "msgctxt":
            if entry.msgid or entry.msgstr:  # a new entry without a blank line between
                current = None
                entry = start(number)
            entry.msgctxt, target = text, ("msgctxt", None)
        elif keyword == "msgid":
            if entry.msgid or entry.msgstr:
                current = None
                entry = start(number)
            entry.msgid, target = text, ("msgid", None)
        elif keyword == "msgid_plural":
            entry.msgid_plural, target = text, ("msgid_plural", None)
        elif keyword == "msgstr":
            entry.msgstr[0], target = text, ("msgstr", 0)
        elif keyword.startswith("msgstr["):
            index = int(keyword[len("msgstr[") : -1])
            entry.msgstr[index], target = text, ("msgstr", index)
        elif keyword == "" and target is not None:
            name, index = target
            if name == "msgstr":
                entry.msgstr[index] += text
            else:
                setattr(entry, name, (getattr(entry, name) or "") + text)
        else:
            raise AssertionError(f"{path}:{number}: cannot read {raw!r}")
    return entries


def catalogues() -> list[Path]:
    return [LC_MESSAGES / f"{domain}.po" for domain in DOMAINS if (LC_MESSAGES / f"{domain}.po").exists()]


def messages(path: Path) -> list[Entry]:
    return [entry for entry in parse_po(path) if entry.msgid]


def ja_get(client, url: str):
    response = client.get(url, HTTP_ACCEPT_LANGUAGE="ja")
    assert response.status_code == 200, response.status_code
    return response.content.decode()


# --- pages in Japanese --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_login_page_follows_accept_language(client):
    page = ja_get(client, reverse("login"))
    assert '<html lang="ja" ' in page
    for text in ("ログイン", "ユーザー名", "パスワード", "演習ポータル", "日本語"):
        assert text in page, text
    assert "Log in" not in page

    english = client.get(reverse("login"), HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert '<html lang="en" ' in english and "Log in" in english and "ログイン" not in english


def test_login_failure_message_in_japanese(client, student_a):
    response = client.post(reverse("login"), {"username": "student_a", "password": "wrong"}, HTTP_ACCEPT_LANGUAGE="ja")
    assert response.status_code == 200
    assert "ユーザー名とパスワードが一致しませんでした。もう一度お試しください。" in response.content.decode()


def test_student_dashboard_in_japanese(client, student_a, lab_a):
    Attempt.objects.create(lab=lab_a, student=student_a, tenant=lab_a.course.tenant, state=AttemptState.RUNNING)
    client.force_login(student_a)
    page = ja_get(client, reverse("dashboard"))
    # Headings, column titles, the attempt's state (a lazy model choice label) and the empty due date and grade.
    for text in (
        "自分の演習",
        '<th scope="col">演習</th>',
        '<th scope="col">提出期限</th>',
        '<th scope="col">成績</th>',
        "実行中",
        "提出期限なし",
        "未採点",
        "ログアウト",
    ):
        assert text in page, text
    for english in ("My labs", "No due date", "Not graded", "Running"):
        assert english not in page, english


def test_attempt_page_and_its_script_strings_in_japanese(client, student_a, lab_a):
    attempt = Attempt.objects.create(
        lab=lab_a, student=student_a, tenant=lab_a.course.tenant, state=AttemptState.RUNNING
    )
    client.force_login(student_a)
    page = ja_get(client, reverse("labs:attempt_detail", args=[attempt.id]))
    for text in ("延長", "チェック", "停止", "ターミナル"):
        assert text in page, text
    # attempt.js shows only what the server translated into the page's JSON block.
    config = json.loads(
        re.search(r'<script id="attempt-config" type="application/json">(.*?)</script>', page, re.S).group(1)
    )
    strings = config["strings"]
    assert strings["time_left"] == "残り時間: %(time)s"
    assert strings["states"]["running"] == "実行中"
    assert strings["console"]["read_only"] == "閲覧のみ: このコンソールを見ています。"
    # The strings are built once per language: the next page in English gets English ones.
    page = client.get(reverse("labs:attempt_detail", args=[attempt.id]), HTTP_ACCEPT_LANGUAGE="en").content.decode()
    config = json.loads(
        re.search(r'<script id="attempt-config" type="application/json">(.*?)</script>', page, re.S).group(1)
    )
    assert config["strings"]["time_left"] == "Time left: %(time)s"


def test_language_cookie_and_switcher(client, student_a, lab_a):
    client.force_login(student_a)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "ja"
    assert "自分の演習" in client.get(reverse("dashboard")).content.decode()

    # The switcher in the header posts to set_language, which sets the cookie for the next pages.
    response = client.post(reverse("set_language"), {"language": "en", "next": reverse("dashboard")})
    assert response.status_code == 302 and response.cookies[settings.LANGUAGE_COOKIE_NAME].value == "en"
    assert "My labs" in client.get(reverse("dashboard")).content.decode()
    client.post(reverse("set_language"), {"language": "ja", "next": reverse("dashboard")})
    assert "自分の演習" in client.get(reverse("dashboard")).content.decode()


def test_admin_index_in_japanese_for_instructor(client, instructor_a):
    client.force_login(instructor_a)
    page = ja_get(client, reverse("admin:index"))
    # The portal's own site titles and operations link, and Django admin's own Japanese ("ログアウト").
    for text in ("演習ポータル管理", "コース・演習・メンバー", "運用ダッシュボード", "ログアウト"):
        assert text in page, text
    assert "Lab portal administration" not in page


def test_admin_course_list_in_japanese(client, instructor_a, course_a):
    client.force_login(instructor_a)
    page = ja_get(client, reverse("admin:portal_course_changelist"))
    assert "コース" in page and course_a.code in page
    assert "Select course to change" not in page


# --- the catalogue ------------------------------------------------------------------------------------------------


def test_catalogue_exists():
    assert (LC_MESSAGES / "django.po").exists() and (LC_MESSAGES / "django.mo").exists()


@pytest.mark.parametrize("path", catalogues(), ids=lambda path: path.name)
def test_catalogue_has_no_untranslated_or_fuzzy_entries(path):
    entries = parse_po(path)
    header = next(entry for entry in entries if entry.msgid == "")
    assert "fuzzy" not in header.flags
    assert "Plural-Forms: nplurals=1; plural=0;" in header.msgstr[0]
    problems = []
    for entry in messages(path):
        if "fuzzy" in entry.flags:
            problems.append(f"line {entry.line}: fuzzy: {entry.msgid!r}")
        expected = [0]  # nplurals=1: one form, plural or not
        if sorted(entry.msgstr) != expected or not entry.msgstr[0].strip():
            problems.append(f"line {entry.line}: untranslated: {entry.msgid!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", catalogues(), ids=lambda path: path.name)
def test_catalogue_holds_exactly_what_the_sources_ask_for(path, tmp_path, settings, monkeypatch):
    """makemessages, run on a copy, finds no string the catalogue lacks and none it holds for nothing. Entries
    written by hand can miss: a ``{% translate %}`` string with a ``%`` in it is looked up with the ``%`` doubled.

    makemessages writes to the ``locale`` directory beside the sources it reads, so it reads them through links
    in a directory of their own: the checkout's catalogue is never touched."""
    from django.core.management import call_command

    copy = tmp_path / "locale" / "ja" / "LC_MESSAGES"
    copy.mkdir(parents=True)
    (copy / path.name).write_bytes(path.read_bytes())
    sources = tmp_path / "sources"
    sources.mkdir()
    for entry in settings.BASE_DIR.iterdir():
        if not entry.name.startswith(".") and entry.name not in ("locale", "var", "staticfiles", "node_modules"):
            (sources / entry.name).symlink_to(entry)
    settings.LOCALE_PATHS = [tmp_path / "locale"]
    monkeypatch.chdir(sources)
    before = path.read_bytes()
    call_command("makemessages", locale=["ja"], domain=path.stem, no_obsolete=True, verbosity=0, symlinks=True)
    assert path.read_bytes() == before, "makemessages wrote into the checkout's catalogue"
    key = lambda entry: (entry.msgctxt, entry.msgid)  # noqa: E731
    committed = {key(entry) for entry in messages(path)}
    extracted = {key(entry) for entry in messages(copy / path.name)}
    assert sorted(extracted - committed, key=str) == [], "in the sources, missing from the catalogue"
    assert sorted(committed - extracted, key=str) == [], "in the catalogue, asked for by no source"


@pytest.mark.parametrize("path", catalogues(), ids=lambda path: path.name)
def test_translations_keep_placeholders_and_markup(path):
    problems = []
    for entry in messages(path):
        translation = entry.msgstr.get(0, "")
        for source in filter(None, (entry.msgid, entry.msgid_plural)):
            if sorted(PLACEHOLDER.findall(source)) != sorted(PLACEHOLDER.findall(translation)):
                problems.append(f"line {entry.line}: placeholders differ: {source!r} -> {translation!r}")
        if sorted(TAG.findall(entry.msgid)) != sorted(TAG.findall(translation)):
            problems.append(f"line {entry.line}: markup differs: {entry.msgid!r} -> {translation!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", catalogues(), ids=lambda path: path.name)
def test_compiled_catalogue_matches_po(path):
    """The committed .mo carries every translation of the .po, so a machine without gettext serves Japanese."""
    with path.with_suffix(".mo").open("rb") as handle:
        compiled = gettext.GNUTranslations(handle)._catalog
    stale = []
    for entry in messages(path):
        key = entry.msgid if entry.msgctxt is None else f"{entry.msgctxt}\x04{entry.msgid}"
        if entry.msgid_plural is not None:
            key = (key, 0)
        if compiled.get(key) != entry.msgstr.get(0):
            stale.append(entry.msgid)
    assert not stale, f"{len(stale)} entries differ from the .mo; run compilemessages: {stale[:5]}"


def test_parser_reads_what_gettext_reads(tmp_path):
    """The catalogue checks above are only as good as this parser: escapes, continuations, plurals, flags."""
    po = tmp_path / "sample.po"
    po.write_text(
        'msgid ""\nmsgstr ""\n"Plural-Forms: nplurals=1; plural=0;\\n"\n\n'
        '#, python-format\nmsgid "a \\"%(x)s\\" "\n"b"\nmsgstr "あ「%(x)s」い"\n\n'
        '#, fuzzy\nmsgid "c"\nmsgstr ""\n\n'
        'msgid "%(n)d file"\nmsgid_plural "%(n)d files"\nmsgstr[0] "%(n)d 個"\n\n'
        '#~ msgid "gone"\n#~ msgstr "消"\n',
        encoding="utf-8",
    )
    entries = messages(po)
    assert [(e.msgid, e.msgstr, "fuzzy" in e.flags) for e in entries] == [
        ('a "%(x)s" b', {0: "あ「%(x)s」い"}, False),
        ("c", {0: ""}, True),
        ("%(n)d file", {0: "%(n)d 個"}, False),
    ]
    assert entries[2].msgid_plural == "%(n)d files"
