"""The apps depend one way: api on labs, grading and portal, never the other way round (shared machinery such
as the rate limits lives in portal)."""

from __future__ import annotations

import ast
from pathlib import Path

from django.conf import settings

CORE_APPS = ("portal", "labs", "grading")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_core_apps_never_import_the_api_app():
    offenders = []
    for app in CORE_APPS:
        for path in sorted((Path(settings.BASE_DIR) / app).rglob("*.py")):
            if "tests" in path.parts or "migrations" in path.parts:
                continue
            bad = {name for name in imported_modules(path) if name == "api" or name.startswith("api.")}
            if bad:
                offenders.append(f"{path.relative_to(settings.BASE_DIR)}: {', '.join(sorted(bad))}")
    assert offenders == []


def test_the_scan_sees_an_api_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom api.ratelimit import rate_limit_hit\n", encoding="utf-8")
    assert "api.ratelimit" in imported_modules(module)


def test_the_import_linter_contracts_hold():
    """pyproject.toml's [tool.importlinter]: portal below labs below grading below ops and api; kubesim and guest
    apart."""
    import subprocess
    import sys

    result = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:]
