"""What a guest's cloud-init does with its NoCloud user data, as far as kubesim goes: find it (inline, base64 or
the Secret behind ``secretRef``), apply ``write_files`` under the guest's root directory, and say what else it
asked for that a simulated guest does not do (``unapplied``), so that nobody mistakes a skipped step for one
that ran."""

from __future__ import annotations

import base64
import binascii
import gzip
import os
from pathlib import Path
from typing import Any

import yaml

from kubesim.store import Store


class CloudInitError(ValueError):
    """User data kubesim cannot apply; the guest boots without it and the reason is logged to its console log."""


def decode_content(content: Any, encoding: str | None) -> bytes:
    """Decode a ``write_files`` entry's content as cloud-init does (b64, gzip, gz+b64 and their aliases)."""
    if content is None:
        return b""
    data = content.encode() if isinstance(content, str) else bytes(content)
    encoding = (encoding or "text/plain").lower()
    if encoding in ("text/plain", ""):
        return data
    if encoding in ("b64", "base64", "gz+b64", "gzip+b64", "gz+base64", "gzip+base64"):
        try:
            data = base64.b64decode(data)
        except binascii.Error as exc:
            raise CloudInitError(f"invalid base64 content: {exc}") from exc
    if encoding.startswith("gz"):
        try:
            data = gzip.decompress(data)
        except OSError as exc:
            raise CloudInitError(f"invalid gzip content: {exc}") from exc
    elif encoding not in ("b64", "base64"):
        raise CloudInitError(f"unknown write_files encoding {encoding!r}")
    return data


def user_data_for(vmi: dict[str, Any], store: Store) -> str | None:
    """The user data a guest's cloud-init would read from its NoCloud (or ConfigDrive) volume."""
    namespace = vmi["metadata"]["namespace"]
    for volume in (vmi.get("spec") or {}).get("volumes") or ():
        source = volume.get("cloudInitNoCloud") or volume.get("cloudInitConfigDrive")
        if not source:
            continue
        if source.get("userData"):
            return source["userData"]
        if source.get("userDataBase64"):
            return base64.b64decode(source["userDataBase64"]).decode(errors="replace")
        secret_ref = (source.get("secretRef") or {}).get("name")
        if secret_ref:
            secret = store.get("secrets", namespace, secret_ref)
            if secret is None:
                raise CloudInitError(f"secret {namespace}/{secret_ref} not found")
            data = secret.get("data") or {}
            for key in ("userdata", "userData"):
                if key in data:
                    return base64.b64decode(data[key]).decode(errors="replace")
            raise CloudInitError(f"secret {namespace}/{secret_ref} has no userdata key")
    return None


def apply_write_files(root: Path, user_data: str) -> list[Path]:
    """Apply a ``#cloud-config``'s write_files under ``root``; returns the files written."""
    if not user_data.lstrip().startswith("#cloud-config"):
        return []
    try:
        document = yaml.safe_load(user_data) or {}
    except yaml.YAMLError as exc:
        raise CloudInitError(f"user data is not valid YAML: {exc}") from exc
    written = []
    for entry in document.get("write_files") or ():
        path = str(entry.get("path") or "")
        if not path.startswith("/"):
            raise CloudInitError(f"write_files path must be absolute: {path!r}")
        target = (root / path.lstrip("/")).resolve()
        if root.resolve() not in target.parents:
            raise CloudInitError(f"write_files path escapes the guest: {path!r}")
        data = decode_content(entry.get("content"), entry.get("encoding"))
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "ab" if entry.get("append") else "wb") as handle:
            handle.write(data)
        permissions = entry.get("permissions")
        if permissions is not None:
            os.chmod(target, int(str(permissions), 8))
        written.append(target)
    return written


# runcmd entries whose effect kubesim emulates itself: the portal's lab agent unit (started as the unit would be)
# and its serial-console autologin (the console shell is the student's from the start).
EMULATED_RUNCMD = frozenset(
    {
        "systemctl daemon-reload",
        "systemctl enable --now lab-agent.service",
        "systemctl restart serial-getty@ttyS0.service",
    }
)
# Users kubesim has already: the guest shell is the student's, and "default" is the image's own user.
SIMULATED_USERS = frozenset({"default", "student"})
# Keys looked at entry by entry below, and write_files, which is applied.
_LISTED_KEYS = frozenset({"write_files", "users", "runcmd", "packages", "bootcmd"})


def _entry_text(entry: Any) -> str:
    if isinstance(entry, (list, tuple)):
        return " ".join(str(part) for part in entry)
    return str(entry)


def unapplied(user_data: str) -> list[str]:
    """What the user data asks for that a kubesim guest does not do, each worded for the guest's console: runcmd
    entries other than the ones kubesim emulates, packages, bootcmd, users other than the student, every other
    module's key, and user data that is not a ``#cloud-config`` at all."""
    text = user_data.lstrip()
    if not text:
        return []
    if not text.startswith("#cloud-config"):
        first_line = text.splitlines()[0][:60]
        return [f"user data of another kind ({first_line!r}): only #cloud-config write_files are applied"]
    try:
        document = yaml.safe_load(user_data) or {}
    except yaml.YAMLError:
        return []  # apply_write_files reports it
    if not isinstance(document, dict):
        return []
    skipped = [
        f"runcmd: {_entry_text(entry)}"
        for entry in document.get("runcmd") or ()
        if _entry_text(entry).strip() not in EMULATED_RUNCMD
    ]
    if document.get("packages"):
        skipped.append("packages: " + " ".join(_entry_text(package) for package in document["packages"]))
    skipped += [f"bootcmd: {_entry_text(entry)}" for entry in document.get("bootcmd") or ()]
    users = [user.get("name") if isinstance(user, dict) else user for user in document.get("users") or ()]
    skipped += [f"users: {name}" for name in users if name not in SIMULATED_USERS]
    skipped += [f"{key}: (not simulated)" for key in document if key not in _LISTED_KEYS]
    return skipped
