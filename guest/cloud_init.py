"""Cloud-init user data that installs the grading agent under systemd in a lab VM, written with PyYAML's safe dumper
and stored in the attempt's Secret (``cloudInitNoCloud.secretRef``: inline user data is capped at 2048 bytes)."""

from __future__ import annotations

import base64
import functools
import gzip
import posixpath
import re
from pathlib import Path
from typing import Any

import yaml

# libyaml's emitter where PyYAML has it (its wheels do): the same document, without walking the agent's base64
# character by character in Python for every VM.
_SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _CloudConfigDumper(_SafeDumper):  # type: ignore[misc,valid-type]
    """PyYAML's safe dumper, writing multi-line text (unit files, scripts) as literal blocks people can read."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # a value used twice is written twice: no anchors in a document people read


def _represent_text(dumper: Any, text: str) -> yaml.ScalarNode:
    # PyYAML falls back to a quoted scalar by itself where a literal block cannot hold the text exactly, but
    # writes NEL literally in a single-quoted one, where its loader then reads a line break: double quotes escape it.
    style = '"' if "\x85" in text else "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_CloudConfigDumper.add_representer(str, _represent_text)


def dump_cloud_config(config: dict[str, Any]) -> str:
    """The mapping as block-style YAML that cloud-init (PyYAML's safe loader) reads back unchanged."""
    return yaml.dump(config, Dumper=_CloudConfigDumper, sort_keys=False, allow_unicode=True, width=4096)


AGENT_PORT = 8787
TOKEN_PATH = "/etc/lab-agent/token"  # noqa: S105 - a path, not a password
AGENT_PATH = "/opt/lab-agent/agent.py"
UNIT_NAME = "lab-agent.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
SETUP_MARKER_PATH = "/var/lib/cloud/instance/boot-finished"
STUDENT_USER = "student"
STUDENT_HOME = "/home/student"
SERIAL_GETTY_UNIT = "serial-getty@ttyS0.service"
SERIAL_AUTOLOGIN_PATH = f"/etc/systemd/system/{SERIAL_GETTY_UNIT}.d/lab-autologin.conf"

# Far below the API server's 1 MiB cap on a Secret, yet refusing an extra config that bloats every attempt's Secret.
MAX_USER_DATA_BYTES = 256 * 1024
MAX_EXTRA_CLOUD_CONFIG_BYTES = 64 * 1024

# Paths the portal's own files live in; extra cloud-config may not write there.
PROTECTED_PATHS = ("/etc/lab-agent", "/opt/lab-agent", UNIT_PATH, f"{UNIT_PATH}.d", SERIAL_AUTOLOGIN_PATH)

# Lists in an extra cloud-config that are appended to ours rather than replacing them.
APPENDED_KEYS = ("write_files", "runcmd", "packages")

# Other user-data formats cloud-init understands; they cannot be merged into one cloud-config.
_OTHER_USER_DATA_HEADERS = ("#!", "#include", "#cloud-boothook", "#part-handler", "#upstart-job", "Content-Type:")

_TOKEN_RE = re.compile(r"[\x21-\x7e]{16,512}")

UNIT_FILE = f"""\
[Unit]
Description=Lab grading agent (answers the portal's checks on TCP {AGENT_PORT})
After=network.target
# Never give up restarting: the portal cannot grade without the agent.
StartLimitIntervalSec=0

[Service]
Type=simple
ExecStart=/usr/bin/python3 {AGENT_PATH} --port {AGENT_PORT} --token-file {TOKEN_PATH} --setup-marker {SETUP_MARKER_PATH}
Restart=always
RestartSec=2
Environment=PYTHONUNBUFFERED=1
# Student workloads that exhaust memory should not take the grader down first.
OOMScoreAdjust=-500

[Install]
WantedBy=multi-user.target
"""

SERIAL_AUTOLOGIN_DROP_IN = f"""\
# The serial console is reached only through the portal's authenticated console bridge.
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin {STUDENT_USER} --keep-baud 115200,57600,38400,9600 %I $TERM
"""


def render_user_data(
    *,
    token: str,
    extra_cloud_config: str = "",
    agent_source: str | None = None,
    serial_autologin: bool = True,
) -> str:
    """The `#cloud-config` document for one attempt's VM (see guest/README.md); ValueError when it cannot be."""
    if not _TOKEN_RE.fullmatch(token):
        raise ValueError("the agent token must be 16 to 512 printable ASCII characters without spaces")
    config = merge_cloud_config(
        base=base_cloud_config(token=token, agent_source=agent_source, serial_autologin=serial_autologin),
        extra=parse_extra_cloud_config(extra_cloud_config),
    )
    document = "#cloud-config\n" + dump_cloud_config(config)
    size = len(document.encode("utf-8"))
    if size > MAX_USER_DATA_BYTES:
        raise ValueError(f"the cloud-init user data is too large: {size} bytes (at most {MAX_USER_DATA_BYTES})")
    return document


@functools.lru_cache(maxsize=4)
def _encoded_agent(source: str | None) -> str:
    """The agent (None: the one shipped with this code) gzipped and in base64 (``gz+b64``), without a timestamp so
    that it always encodes the same; once per process, since every VM gets the same one."""
    if source is None:
        source = Path(__file__).with_name("agent.py").read_text(encoding="utf-8")
    return base64.b64encode(gzip.compress(source.encode("utf-8"), mtime=0)).decode("ascii")


def _root_file(path: str, permissions: str, content: str, **encoding: str) -> dict[str, str]:
    return {"path": path, "owner": "root:root", "permissions": permissions, **encoding, "content": content}


def base_cloud_config(*, token: str, agent_source: str | None, serial_autologin: bool) -> dict[str, Any]:
    """The portal's part of the cloud-config, as a plain mapping."""
    write_files = [
        _root_file(TOKEN_PATH, "0600", token + "\n"),
        _root_file(AGENT_PATH, "0755", _encoded_agent(agent_source), encoding="gz+b64"),
        _root_file(UNIT_PATH, "0644", UNIT_FILE),
    ]
    runcmd = ["systemctl daemon-reload", f"systemctl enable --now {UNIT_NAME}"]
    if serial_autologin:
        write_files.append(_root_file(SERIAL_AUTOLOGIN_PATH, "0644", SERIAL_AUTOLOGIN_DROP_IN))
        # The getty may already show a login prompt by the time cloud-init runs; restart it to log in.
        runcmd.append(f"systemctl restart {SERIAL_GETTY_UNIT}")
    return {
        "users": [
            "default",
            {
                "name": STUDENT_USER,
                "gecos": "Lab student",
                "homedir": STUDENT_HOME,
                "shell": "/bin/bash",
                "lock_passwd": True,
            },
        ],
        "write_files": write_files,
        "runcmd": runcmd,
    }


def parse_extra_cloud_config(text: str) -> dict[str, Any]:
    """Parse and check a lab's extra cloud-config (empty text: an empty mapping); ValueError with the reason."""
    if not text.strip():
        return {}
    first_line = text.lstrip().split("\n", 1)[0].strip()
    if first_line.startswith(_OTHER_USER_DATA_HEADERS):
        kind = first_line.split()[0]
        raise ValueError(f"the extra cloud-config must be a #cloud-config mapping; {kind!r} user data cannot be merged")
    if len(text.encode("utf-8")) > MAX_EXTRA_CLOUD_CONFIG_BYTES:
        raise ValueError(f"the extra cloud-config is larger than {MAX_EXTRA_CLOUD_CONFIG_BYTES} bytes")
    try:
        # Anchors and aliases could expand exponentially (or loop) once the mapping is written out again.
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=yaml.SafeLoader)):
            raise ValueError("the extra cloud-config must not use YAML aliases (*name)")
        extra = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"the extra cloud-config is not valid YAML: {exc}") from None
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise ValueError(f"the extra cloud-config must be a YAML mapping, not {_yaml_type_name(extra)}")
    for key in extra:
        if not isinstance(key, str):
            raise ValueError(f"the extra cloud-config has a key that is not a string: {key!r}")
    for key in (*APPENDED_KEYS, "users"):
        if key in extra and not isinstance(extra[key], list):
            raise ValueError(f"{key} in the extra cloud-config must be a list, not {_yaml_type_name(extra[key])}")
    for index, entry in enumerate(extra.get("write_files", [])):
        where = f"write_files[{index}] in the extra cloud-config"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a mapping")
        path = entry.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"{where} needs an absolute path")
        # One leading slash: normpath keeps two, which POSIX leaves to the implementation.
        normalised = posixpath.normpath("/" + path.lstrip("/"))
        if any(normalised == protected or normalised.startswith(protected + "/") for protected in PROTECTED_PATHS):
            raise ValueError(f"{where} would overwrite the grading agent's file {path}")
    return extra


def merge_cloud_config(*, base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Merge a checked extra cloud-config into ours: lists appended, our student user replaceable, rest kept."""
    merged = dict(base)
    for key, value in extra.items():
        if key in APPENDED_KEYS:
            merged[key] = [*base.get(key, []), *value]
        elif key == "users":
            merged[key] = _merge_users(base=base.get("users", []), extra=value)
        else:
            merged[key] = value
    return merged


def _merge_users(*, base: list[Any], extra: list[Any]) -> list[Any]:
    def name_of(entry: Any) -> str | None:
        if isinstance(entry, str):
            return entry
        name = entry.get("name") if isinstance(entry, dict) else None
        return name if isinstance(name, str) else None

    extra_by_name = {name_of(entry): entry for entry in extra}
    # An extra entry with the same name (e.g. `student` with sudo or groups) takes our entry's place.
    merged = [extra_by_name.pop(name_of(entry), entry) for entry in base]
    return merged + [entry for entry in extra if name_of(entry) in extra_by_name]


def _yaml_type_name(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"
