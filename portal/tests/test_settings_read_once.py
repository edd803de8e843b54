"""Every setting is defined, with its default, in the portal.settings package; modules read ``settings.NAME`` and never
supply a default of their own (which would drift from the settings module's)."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

PRODUCT_APPS = ("portal", "labs", "grading", "api", "ops")
DEFAULTED_READ = re.compile(r"getattr\(\s*settings\s*,")


def defaulted_reads(path: Path) -> list[str]:
    return [
        f"{path.name}:{number}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if DEFAULTED_READ.search(line)
    ]


def test_no_module_reads_a_setting_with_a_default_of_its_own():
    base = Path(settings.BASE_DIR)
    offenders = [
        hit
        for app in PRODUCT_APPS
        for path in sorted((base / app).rglob("*.py"))
        if "tests" not in path.parts and "migrations" not in path.parts
        for hit in defaulted_reads(path)
    ]
    assert offenders == []


def test_the_scan_sees_a_defaulted_read(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('limit = getattr(settings, "SOME_LIMIT", 5)\n', encoding="utf-8")
    assert defaulted_reads(module) == ["m.py:1"]
