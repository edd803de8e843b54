"""run_portal's choice of guest for the embedded kubesim, and the reason it gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from portal import embedded as choice_module
from portal.embedded import GuestUnavailable, guest_choice


def test_a_guest_given_by_the_operator_is_kept(monkeypatch):
    monkeypatch.setattr(choice_module.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    choice = guest_choice(["--zero-delays", "--guest=none"])
    assert choice.kubesim_args == () and "--kubesim-arg" in choice.reason


def test_without_qemu_the_sandboxed_shell_and_how_to_get_vms(monkeypatch):
    monkeypatch.setattr(choice_module.shutil, "which", lambda tool: "/usr/bin/bwrap" if tool == "bwrap" else None)
    choice = guest_choice([])
    assert choice.guest == "shell" and choice.kubesim_args == ("--guest=shell",)
    assert "qemu-system-x86_64" in choice.reason and "apt-get install qemu-system-x86" in choice.reason


def test_with_qemu_but_no_image_built_the_shell_and_the_build_command(monkeypatch, tmp_path):
    monkeypatch.setattr(choice_module.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setenv("LAB_IMAGE_CACHE", str(tmp_path))  # an empty cache: the build script finds nothing
    choice = guest_choice([])
    assert choice.guest == "shell" and "guest/image/build" in choice.reason


def test_with_qemu_and_the_image_real_vms(monkeypatch, tmp_path):
    monkeypatch.setattr(choice_module.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(choice_module, "cached_guest_image", lambda: Path(tmp_path))
    choice = guest_choice([])
    assert choice.guest == "vm"
    assert choice.kubesim_args == ("--guest=vm", f"--guest-image={tmp_path}")


def test_without_bubblewrap_or_qemu_a_clear_refusal_naming_what_to_install(monkeypatch):
    monkeypatch.setattr(choice_module.shutil, "which", lambda tool: None)
    with pytest.raises(GuestUnavailable, match="apt-get install bubblewrap"):
        guest_choice([])
