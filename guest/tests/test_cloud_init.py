"""Tests for the cloud-init user data that installs the grading agent."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from guest import agent, cloud_init
from guest.cloud_init import (
    AGENT_PATH,
    AGENT_PORT,
    TOKEN_PATH,
    UNIT_PATH,
    parse_extra_cloud_config,
    render_user_data,
)

TOKEN = "Zm9yLXRlc3RzLW9ubHktMTIzNDU2Nzg5MA"
GUEST_DIR = Path(cloud_init.__file__).parent
SCHEMA_PATH = Path(__file__).parent / "schemas" / "cloud-config-v1-22.4.2.json"


def written_file(user_data: str, *, path: str) -> bytes:
    """The decoded content that the document's `write_files` puts at `path`."""
    config = yaml.safe_load(user_data)
    if not isinstance(config, dict):
        raise ValueError("the user data is not a cloud-config mapping")
    for entry in config.get("write_files") or []:
        if isinstance(entry, dict) and entry.get("path") == path:
            content = str(entry.get("content", ""))
            encoding = entry.get("encoding", "text")
            if encoding in ("b64", "base64"):
                return base64.b64decode(content)
            if encoding in ("gz+b64", "gzip+b64", "gz+base64", "gzip+base64"):
                return gzip.decompress(base64.b64decode(content))
            if encoding == "text":
                return content.encode("utf-8")
            raise ValueError(f"unsupported write_files encoding for {path}: {encoding}")
    raise ValueError(f"the user data writes no file at {path}")


def token_from_user_data(user_data: str) -> str:
    """The agent token that a rendered document installs."""
    return written_file(user_data, path=TOKEN_PATH).decode("utf-8").strip()


def _load(document: str) -> dict[str, Any]:
    config = yaml.safe_load(document)
    assert isinstance(config, dict)
    return config


def _files(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["path"]: entry for entry in config["write_files"]}


def _schema_errors(config: dict[str, Any]) -> list[str]:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{list(error.absolute_path)}: {error.message}" for error in validator.iter_errors(config)]


# --- the document -----------------------------------------------------------------------------------------------


def test_document_is_cloud_config_yaml_and_valid_for_cloud_init() -> None:
    document = render_user_data(token=TOKEN)
    assert document.startswith("#cloud-config\n")
    config = _load(document)
    assert _schema_errors(config) == []
    assert len(document.encode()) < cloud_init.MAX_USER_DATA_BYTES
    assert len(document.encode()) < 64 * 1024  # a Secret may hold 1 MiB; stay far below it


def test_document_writes_the_token_readable_by_root_only() -> None:
    config = _load(render_user_data(token=TOKEN))
    token_file = _files(config)[TOKEN_PATH]
    assert token_file["permissions"] == "0600"
    assert token_file["owner"] == "root:root"
    assert token_file["content"].strip() == TOKEN
    assert token_from_user_data(render_user_data(token=TOKEN)) == TOKEN


def test_document_installs_this_agent_verbatim() -> None:
    document = render_user_data(token=TOKEN)
    agent_file = _files(_load(document))[AGENT_PATH]
    assert agent_file["permissions"] == "0755"
    assert agent_file["encoding"] == "gz+b64"  # a third of the size in plain base64, in every VM's Secret
    expected = (GUEST_DIR / "agent.py").read_bytes()
    assert gzip.decompress(base64.b64decode(agent_file["content"])) == expected
    assert len(agent_file["content"]) < len(expected) / 2
    assert written_file(document, path=AGENT_PATH) == expected


def test_given_agent_source_is_installed_instead() -> None:
    document = render_user_data(token=TOKEN, agent_source="print('another agent')\n")
    assert written_file(document, path=AGENT_PATH) == b"print('another agent')\n"


def test_the_agent_encoded_once_is_each_documents_own_and_tokens_stay_apart() -> None:
    # The agent's encoding and quoting are kept between documents (the same in every VM): each document still gets
    # the agent it was given and its own token, whichever order they are made in.
    local = (GUEST_DIR / "agent.py").read_bytes()
    other = "print('agent two')\n" * 400  # long enough to be quoted once and kept
    documents = [
        render_user_data(token=f"{TOKEN}{n}", agent_source=source)
        for n, source in enumerate((None, other, None, other))
    ]
    for n, document in enumerate(documents):
        assert written_file(document, path=AGENT_PATH) == (local if n % 2 == 0 else other.encode())
        assert token_from_user_data(document) == f"{TOKEN}{n}"


def test_document_runs_the_agent_under_systemd_as_root() -> None:
    config = _load(render_user_data(token=TOKEN))
    unit = _files(config)[UNIT_PATH]["content"]
    assert (
        "ExecStart=/usr/bin/python3 /opt/lab-agent/agent.py --port 8787 --token-file /etc/lab-agent/token "
        "--setup-marker /var/lib/cloud/instance/boot-finished\n"
    ) in unit
    assert "Restart=always\n" in unit
    assert "User=" not in unit  # root: checks inspect the whole system
    assert "WantedBy=multi-user.target" in unit
    assert config["runcmd"][:2] == ["systemctl daemon-reload", "systemctl enable --now lab-agent.service"]


def test_document_creates_the_student_and_logs_them_in_on_the_serial_console() -> None:
    config = _load(render_user_data(token=TOKEN))
    student = next(user for user in config["users"] if isinstance(user, dict) and user["name"] == "student")
    assert student["homedir"] == "/home/student"
    assert student["shell"] == "/bin/bash"
    assert "default" in config["users"]
    getty = _files(config)[cloud_init.SERIAL_AUTOLOGIN_PATH]["content"]
    assert "--autologin student" in getty
    assert "systemctl restart serial-getty@ttyS0.service" in config["runcmd"]


def test_serial_autologin_can_be_left_out() -> None:
    config = _load(render_user_data(token=TOKEN, serial_autologin=False))
    assert cloud_init.SERIAL_AUTOLOGIN_PATH not in _files(config)
    assert not any("serial-getty" in command for command in config["runcmd"])


def test_constants_match_the_agent_defaults() -> None:
    assert AGENT_PORT == agent.DEFAULT_PORT == 8787
    assert TOKEN_PATH == agent.DEFAULT_TOKEN_FILE
    assert cloud_init.STUDENT_HOME == agent.DEFAULT_HOME


@pytest.mark.parametrize("token", ["short", "x" * 513, "has space" * 3, "line\nbreak" * 3, "ünïcode" * 4, ""])
def test_bad_tokens_are_refused(token: str) -> None:
    with pytest.raises(ValueError, match="token"):
        render_user_data(token=token)


def test_installed_agent_answers_with_the_installed_token(tmp_path: Path) -> None:
    """The files as cloud-init would write them make a working agent."""
    document = render_user_data(token=TOKEN)
    token_file = tmp_path / "token"
    token_file.write_bytes(written_file(document, path=TOKEN_PATH))
    agent_file = tmp_path / "agent.py"
    agent_file.write_bytes(written_file(document, path=AGENT_PATH))
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, str(agent_file), "--host", "127.0.0.1", "--port", "0", "--token-file", str(token_file),
         "--port-file", str(port_file), "--home", str(tmp_path)],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists():
            assert proc.poll() is None, "the installed agent did not start"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        conn = http.client.HTTPConnection("127.0.0.1", int(port_file.read_text()), timeout=10)
        conn.request("GET", "/healthz", headers={"Authorization": f"Bearer {TOKEN}"})
        response = conn.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["ready"] is True
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --- merging a lab's extra cloud-config -------------------------------------------------------------------------

EXTRA = """\
#cloud-config
package_update: true
packages:
  - nginx
  - [curl, "7.88*"]
timezone: Asia/Tokyo
write_files:
  - path: /home/student/README.txt
    content: |
      こんにちは
      Edit /etc/nginx/sites-enabled/default.
    owner: student:student
    defer: true
runcmd:
  - systemctl disable --now nginx
users:
  - default
  - name: student
    sudo: "ALL=(ALL) NOPASSWD:ALL"
    groups: [adm]
    shell: /bin/bash
  - name: auditor
    lock_passwd: true
"""


def test_extra_cloud_config_is_merged() -> None:
    base = _load(render_user_data(token=TOKEN))
    merged = _load(render_user_data(token=TOKEN, extra_cloud_config=EXTRA))
    assert _schema_errors(merged) == []

    # Lists are appended after the portal's own entries, which keep their place.
    assert merged["write_files"][: len(base["write_files"])] == base["write_files"]
    assert merged["write_files"][-1]["path"] == "/home/student/README.txt"
    assert merged["write_files"][-1]["content"] == "こんにちは\nEdit /etc/nginx/sites-enabled/default.\n"
    assert merged["write_files"][-1]["defer"] is True
    assert merged["runcmd"] == [*base["runcmd"], "systemctl disable --now nginx"]
    assert merged["packages"] == ["nginx", ["curl", "7.88*"]]
    # Other keys are kept.
    assert merged["package_update"] is True
    assert merged["timezone"] == "Asia/Tokyo"
    # The lab's `student` replaces the portal's; other users are added; `default` is not doubled.
    assert [u if isinstance(u, str) else u["name"] for u in merged["users"]] == ["default", "student", "auditor"]
    student = merged["users"][1]
    assert student["sudo"] == "ALL=(ALL) NOPASSWD:ALL"
    assert student["groups"] == ["adm"]
    # The agent and its token are untouched.
    assert token_from_user_data(render_user_data(token=TOKEN, extra_cloud_config=EXTRA)) == TOKEN


@pytest.mark.parametrize("extra", ["", "   \n", "# nothing yet\n", "#cloud-config\n", "#cloud-config\n{}\n"])
def test_empty_extra_cloud_config_changes_nothing(extra: str) -> None:
    assert render_user_data(token=TOKEN, extra_cloud_config=extra) == render_user_data(token=TOKEN)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("packages: [nginx\n", "not valid YAML"),
        ("- nginx\n- curl\n", "must be a YAML mapping, not a list"),
        ("just words\n", "must be a YAML mapping, not a string"),
        ("#!/bin/bash\napt-get install -y nginx\n", "'#!/bin/bash' user data cannot be merged"),
        ("#include\nhttps://example.test/config\n", "cannot be merged"),
        ("a: 1\n---\nb: 2\n", "not valid YAML"),
        ("write_files: {path: /etc/motd}\n", "write_files in the extra cloud-config must be a list"),
        ("runcmd: echo hi\n", "runcmd in the extra cloud-config must be a list"),
        ("packages: nginx\n", "packages in the extra cloud-config must be a list"),
        ("users: student\n", "users in the extra cloud-config must be a list"),
        ("write_files: [/etc/motd]\n", r"write_files\[0\] in the extra cloud-config must be a mapping"),
        ("write_files:\n  - content: hi\n", "needs an absolute path"),
        ("write_files:\n  - path: etc/motd\n", "needs an absolute path"),
        (f"write_files:\n  - path: {TOKEN_PATH}\n    content: stolen\n", "would overwrite the grading agent"),
        (f"write_files:\n  - path: {AGENT_PATH}\n    content: fake\n", "would overwrite the grading agent"),
        ("write_files:\n  - path: /opt/lab-agent/../lab-agent/./agent.py\n", "would overwrite the grading agent"),
        ("write_files:\n  - path: //etc//lab-agent/token\n", "would overwrite the grading agent"),
        ("write_files:\n  - path: /etc/lab-agent/other\n", "would overwrite the grading agent"),
        (f"write_files:\n  - path: {UNIT_PATH}\n", "would overwrite the grading agent"),
        (f"write_files:\n  - path: {UNIT_PATH}.d/override.conf\n", "would overwrite the grading agent"),
        ("base: &b [1, 2]\nagain: *b\n", "aliases"),
        ("1: one\n", "key that is not a string"),
        ("runcmd:\n" + "  - echo padding-padding-padding-padding\n" * 2000, "larger than"),
    ],
)
def test_bad_extra_cloud_config_is_refused(extra: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render_user_data(token=TOKEN, extra_cloud_config=extra)
    # The same check is available on its own for the lab form.
    with pytest.raises(ValueError, match=message):
        parse_extra_cloud_config(extra)


def test_writing_next_to_the_agent_directories_is_allowed() -> None:
    extra = "write_files:\n  - path: /etc/lab-agent-notes.txt\n    content: fine\n"
    config = _load(render_user_data(token=TOKEN, extra_cloud_config=extra))
    assert _files(config)["/etc/lab-agent-notes.txt"]["content"] == "fine"


def test_result_too_large_for_a_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="too large"):
        # Random text: the agent is shipped gzipped, and a repetitive one would shrink below the limit.
        incompressible = base64.b64encode(os.urandom(cloud_init.MAX_USER_DATA_BYTES)).decode("ascii")
        render_user_data(token=TOKEN, agent_source=incompressible)


# --- the YAML emitter -------------------------------------------------------------------------------------------

TRICKY_STRINGS = [
    "yes", "no", "on", "off", "null", "~", "true", "123", "0755", "1e3", "0x1F", ".inf", "2026-01-31",
    "", " leading and trailing ", "key: value", "- dash", "# hash", "quote \" and 'single'", "back\\slash",
    "tab\there", "multi\nline\n", "trailing newlines\n\n", "\r\n", "日本語のテキスト", "emoji 🎓",
    "nel\x85line", "sep\u2028para\u2029", "del\x7f", "c1\x9b", "bom\ufeff", "nul\x00", "{flow}", "[flow]",
    "&anchor", "*alias", "!tag", "%directive", "@at", "`tick", "|", ">", "?", "...", "---",
]  # fmt: skip


def test_emitter_round_trips_tricky_values_through_yaml() -> None:
    value = {
        "strings": TRICKY_STRINGS,
        "numbers": [0, -1, 2**40, 0.5, 1e20, 1e-5, -2.5e-10],
        "flags": [True, False, None],
        "empty": {"list": [], "map": {}},
        "nested": [[1, [2, [3]]], {"a": {"b": [{"c": "d"}]}}],
        "weird keys": {"yes": 1, "on": 2, "key with space": 3, "日本": 4, "-dash": 5, "": 6, "n": 7},
    }
    assert yaml.safe_load(cloud_init.dump_cloud_config(value)) == value


def test_values_yaml_has_and_json_lacks_are_kept() -> None:
    config = _load(render_user_data(token=TOKEN, extra_cloud_config="blob: !!binary aGVsbG8=\nwhen: 2026-12-04\n"))
    assert config["blob"] == b"hello"
    assert str(config["when"]) == "2026-12-04"


def test_multi_line_files_are_literal_blocks_people_can_read() -> None:
    document = render_user_data(token=TOKEN)
    # The unit file reads as itself in `kubectl get secret -o yaml` output and in the guest's user-data copy.
    assert "  content: |\n    [Unit]\n    Description=Lab grading agent" in document
    assert "\\n" not in document


def test_a_value_used_twice_is_written_twice_without_anchors() -> None:
    shared = {"path": "/etc/motd", "content": "hello\n"}
    text = cloud_init.dump_cloud_config({"write_files": [shared, shared]})
    assert "&" not in text and "*" not in text
    assert yaml.safe_load(text) == {"write_files": [shared, shared]}


def test_libyaml_writes_the_document_the_pure_python_emitter_writes() -> None:
    """The emitter is libyaml's for speed; the document is the same (where a value holds characters beyond the
    BMP libyaml writes them escaped, read back the same: the round-trip test above)."""

    class PurePython(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    PurePython.add_representer(str, cloud_init._represent_text)
    assert yaml.__with_libyaml__, "PyYAML's wheels carry libyaml"
    extra = (
        "write_files:\n  - path: /etc/motd\n    content: |\n      hello, 日本語\n      there\n"
        "runcmd: [[echo, 'x: y'], 'yes', '0755']\npackages: [git]\n"
    )
    config = cloud_init.base_cloud_config(token=TOKEN, agent_source="print('agent')\n", serial_autologin=True)
    config = cloud_init.merge_cloud_config(base=config, extra=cloud_init.parse_extra_cloud_config(extra))
    expected = yaml.dump(config, Dumper=PurePython, sort_keys=False, allow_unicode=True, width=4096)
    assert cloud_init.dump_cloud_config(config) == expected
