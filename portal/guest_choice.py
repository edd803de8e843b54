"""Which guest the embedded default's kubesim runs: real VMs where QEMU and the lab image are there, else the
sandboxed shell; with the reason, which run_portal says at start."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

QEMU = "qemu-system-x86_64"
SEED_TOOL = "genisoimage"
SANDBOX_TOOL = "bwrap"


class GuestUnavailable(Exception):
    """Neither guest can run here; the message says what to install."""


@dataclass(frozen=True)
class GuestChoice:
    guest: str
    reason: str
    kubesim_args: tuple[str, ...]


def image_build_script() -> Path:
    return Path(settings.BASE_DIR) / "guest" / "image" / "build"


def cached_guest_image() -> Path | None:
    """The lab guest image for the current recipe if it is built already (building takes minutes: not here)."""
    result = subprocess.run([str(image_build_script()), "--cached-only"], capture_output=True, text=True)
    path = result.stdout.strip()
    return Path(path) if result.returncode == 0 and path else None


def guest_choice(kubesim_args: list[str]) -> GuestChoice:
    """The guest for the embedded kubesim, given the extra kubesim arguments the operator passed."""
    if any(arg == "--guest" or arg.startswith("--guest=") for arg in kubesim_args):
        return GuestChoice("as given", "chosen with --kubesim-arg", ())
    missing = [tool for tool in (QEMU, SEED_TOOL) if shutil.which(tool) is None]
    image = None if missing else cached_guest_image()
    if image is None:
        if missing:
            why = f"{' and '.join(missing)} not installed (apt-get install qemu-system-x86 genisoimage for real VMs)"
        else:
            why = f"QEMU is installed but the lab guest image is not built yet (run {image_build_script()}, once)"
        if shutil.which(SANDBOX_TOOL) is None:
            raise GuestUnavailable(
                f"No guest can run here: the sandboxed shell needs bubblewrap (apt-get install "
                f"bubblewrap), and real VMs are out: {why}. --kubesim-arg=--guest=none gives "
                "a loopback console without a guest."
            )
        return GuestChoice("shell", why, ("--guest=shell",))
    return GuestChoice(
        "vm", f"QEMU is installed and the lab guest image is built ({image})", ("--guest=vm", f"--guest-image={image}")
    )
