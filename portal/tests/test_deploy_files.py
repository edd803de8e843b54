"""docker-compose.yml and the Dockerfile read against the settings: no Docker engine runs in the test suite, so
what the production wiring relies on is checked from the files themselves."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
PORTAL_SERVICES = ("migrate", "web", "worker", "beat")


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def settings_source() -> str:
    return (ROOT / "portal" / "settings.py").read_text()


def test_every_variable_compose_gives_the_portal_is_one_the_settings_read():
    source = settings_source()
    read = set(re.findall(r'env_(?:str|int|bool|list)\("([A-Z0-9_]+)"', source))
    read |= set(re.findall(r'os\.environ(?:\.get)?[\[(]"([A-Z0-9_]+)"', source))
    for name in PORTAL_SERVICES:
        environment = compose()["services"][name]["environment"]
        unread = sorted(set(environment) - read)
        assert unread == [], f"{name}: set in docker-compose.yml but read by no setting: {unread}"
        assert {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "ALLOWED_HOSTS"} <= set(environment), name


def test_directories_compose_mounts_volumes_on_are_made_in_the_image_for_its_user():
    """A new named volume takes the ownership of the directory it is mounted on; one the image lacks is root's,
    and the portal runs as an unprivileged user."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\S+)", dockerfile, re.M).group(1)
    made = set(re.findall(r"mkdir -p ((?:/\S+ ?)+)", dockerfile))
    made = {path for group in made for path in group.split()}
    owned = re.findall(rf"chown -R {user} (\S+)", dockerfile)
    named = set(compose().get("volumes") or {})
    for name in PORTAL_SERVICES:
        for volume in compose()["services"][name].get("volumes") or ():
            source, target = volume.split(":")[:2]
            if source not in named:
                continue  # a bind mount (the kubeconfig, read-only) is the host's to get right
            assert any(target == path or target.startswith(path.rstrip("/") + "/") for path in made), (
                f"{name}: {target} is not made in the image"
            )
            assert any(target == path or target.startswith(path.rstrip("/") + "/") for path in owned), (
                f"{name}: {target} is not owned by {user} in the image"
            )


def test_recordings_go_where_compose_keeps_them():
    environment = compose()["services"]["web"]["environment"]
    targets = {volume.split(":")[1] for volume in compose()["services"]["web"]["volumes"]}
    assert environment["CONSOLE_RECORDINGS_DIR"] in targets
