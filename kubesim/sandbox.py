"""The shell guest's sandbox: bubblewrap around each guest process (own namespaces, the guest's directory as root,
the host's /usr read-only, unprivileged when kubesim is root), so a student reaches only their own guest; the
agent's token directory is bound into the agent's sandbox only (``kubesim/README.md``, "Guests")."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

BWRAP = "bwrap"
SANDBOX_UID = 65534  # nobody: the host user sandboxes run as when kubesim itself is root
GUEST_UID = {"root": 0, "student": 1000}
# What a shell and the agent need of the host's /etc; everything else in /etc is the guest's own.
_TOP_DIRS = ("bin", "sbin", "lib", "lib64", "lib32")
_HOST_ETC = ("ld.so.cache", "alternatives", "localtime", "bash.bashrc", "inputrc", "terminfo")


def bwrap_available() -> bool:
    return shutil.which(BWRAP) is not None


def host_uid() -> int | None:
    """The host user to drop to before entering a sandbox (None: kubesim's own user, already unprivileged)."""
    return SANDBOX_UID if os.geteuid() == 0 else None


def prepare_root(root: Path, *, hostname: str) -> None:
    """The guest's own /etc (users, hostname) and, when kubesim is root, the tree handed to the sandbox's user."""
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    if not (etc / "passwd").exists():
        (etc / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/bash\nstudent:x:1000:1000:Lab student:/home/student:/bin/bash\n"
        )
        (etc / "group").write_text("root:x:0:\nstudent:x:1000:\n")
    (etc / "hostname").write_text(hostname + "\n")
    (etc / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n")
    for directory in ("root", "run", "tmp", "var/log"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    # The root is bind-mounted as the sandbox's /: the host's merged-/usr links are made here once, since bwrap
    # would write them into this directory on every start and fail the second time.
    for top in _TOP_DIRS:
        host, guest = Path("/") / top, root / top
        if host.is_symlink() and not guest.is_symlink() and not guest.exists():
            guest.symlink_to(os.readlink(host))
    hand_over(root)


def hand_over(tree: Path) -> None:
    """When kubesim is root: the tree to the sandbox's host user."""
    uid = host_uid()
    if uid is not None:
        for path in (tree, *tree.rglob("*")):
            os.lchown(path, uid, uid)


def keep_apart(root: Path, directory: str) -> Path | None:
    """Move ``directory`` (a guest path) out of the guest's tree, to a sibling only the sandbox that binds it
    (``command(binds=...)``) can see; an empty directory stays in its place. None when the guest has none."""
    inside = root / directory.strip("/")
    if not inside.is_dir():
        return None
    apart = root.parent / f"{root.name}.{inside.name}"
    shutil.rmtree(apart, ignore_errors=True)
    shutil.move(str(inside), str(apart))
    inside.mkdir(mode=0o755)
    apart.chmod(0o700)
    hand_over(apart)
    return apart


def command(
    root: Path,
    argv: list[str],
    *,
    user: str,
    hostname: str,
    cwd: str = "/home/student",
    binds: tuple[tuple[Path, str], ...] = (),
    devices: dict[str, str] | None = None,
) -> list[str]:
    """bwrap's command line that runs ``argv`` inside the guest rooted at ``root`` as the guest's ``user``, with
    each host directory of ``binds`` mounted (writable) at its guest path; ``devices`` maps a host device to its
    path in the sandbox's /dev (the console's pty as /dev/ttyS0)."""
    args = [
        BWRAP,
        "--unshare-all",
        "--die-with-parent",
        "--bind",
        str(root),
        "/",
        "--ro-bind",
        "/usr",
        "/usr",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--hostname",
        hostname,
        "--uid",
        str(GUEST_UID[user]),
        "--gid",
        str(GUEST_UID[user]),
    ]
    for top in _TOP_DIRS:
        path = Path("/") / top
        if path.is_dir() and not path.is_symlink():
            args += ["--ro-bind", str(path), f"/{top}"]
    for name in _HOST_ETC:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for host, guest in binds:
        args += ["--bind", str(host), guest]
    for host_device, guest_path in (devices or {}).items():
        args += ["--dev-bind", host_device, guest_path]
    return [*args, "--chdir", cwd, "--", *argv]
