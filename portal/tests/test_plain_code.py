"""The product code uses Django's and its libraries' public APIs: no reaching into the ORM's internals and no
hand-written SQL (CONVENTIONS 14)."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

PRODUCT_APPS = ("portal", "labs", "grading", "api", "guest")
# Names of the ORM's internals, and the raw cursor: each one breaks or bypasses what a Django upgrade keeps stable.
INTERNALS = re.compile(
    r"\b(_result_cache|klass_info|get_related_populators|UpdateQuery|connection\.cursor|\.raw\(|"
    r"register_loader|get_compiler)\b"
)


def product_modules() -> list[Path]:
    base = Path(settings.BASE_DIR)
    return [
        path
        for app in PRODUCT_APPS
        for path in sorted((base / app).rglob("*.py"))
        if "tests" not in path.parts and "migrations" not in path.parts
    ]


def internals_used(path: Path) -> list[str]:
    return [
        f"{path.name}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if INTERNALS.search(line)
    ]


def test_product_code_uses_no_orm_internals_nor_raw_sql():
    offenders = [hit for path in product_modules() for hit in internals_used(path)]
    assert offenders == []


def test_the_scan_sees_a_raw_cursor(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("with connection.cursor() as cursor:\n    pass\nrows = qs._result_cache\n", encoding="utf-8")
    assert len(internals_used(module)) == 2
