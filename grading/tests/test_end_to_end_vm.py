"""One lab through the portal on a real VM (kubesim --guest vm, marked vm): Start, real cloud-init and the agent
under systemd, the console socket on the real serial line, Check failing then passing after a fix, Stop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from decimal import Decimal
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from grading.models import RunState
from grading.services import grading_run_request
from kubesim.testing import KubesimServer
from labs.models import AttemptState
from labs.services import attempt_start, attempt_stop, tracking
from labs.tests.conftest import sync_until, wait_until
from labs.tests.test_consumers import connected_student, isolated_console_state  # noqa: F401 - autouse fixture

pytestmark = [pytest.mark.vm, pytest.mark.django_db(transaction=True), pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
BOOT_TIMEOUT = 600  # TCG on a shared 2-core machine; about a minute when the machine is idle


@pytest.fixture(scope="module")
def vm_kubesim(tmp_path_factory):
    built = subprocess.run([str(REPO / "guest/image/build")], capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stderr
    with KubesimServer(tmp_path_factory.mktemp("kubesim-vm"), guest="vm", guest_image=built.stdout.strip()) as sim:
        yield sim


@pytest.fixture
def vm_cluster(vm_kubesim, settings, eager_celery):
    from labs.kubevirt import client as kube_client

    settings.KUBECONFIG = str(vm_kubesim.kubeconfig)
    settings.ATTEMPT_FOLLOW_UP_SECONDS = ()
    settings.GRADING_MIN_INTERVAL_SECONDS = 0
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    kube_client.reset()
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)
    yield vm_kubesim
    kube_client.reset()


def _check(attempt, student, capture):
    with capture(execute=True):
        run = grading_run_request(actor=student, attempt=attempt)
    run.refresh_from_db()
    return run


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_a_lab_on_a_real_vm_start_console_check_fix_check_stop(
    vm_cluster, student_a, lab_a, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    started = time.monotonic()

    def start():
        with capture(execute=True):
            return attempt_start(actor=student_a, lab=lab_a)

    attempt = await sync_to_async(start)()
    await sync_to_async(sync_until)(attempt, AttemptState.RUNNING, timeout=BOOT_TIMEOUT)
    agent_ready = time.monotonic() - started
    guest = vm_cluster.admin.guest(attempt.namespace, attempt.vm_name)
    assert guest["qemu_pid"] and _alive(guest["qemu_pid"])

    # The portal's console socket reaches the real serial line, where the getty logged the student in.
    student = await connected_student(student_a, attempt.id)
    deadline = time.monotonic() + BOOT_TIMEOUT
    while not student.has_output(b"who=student"):
        assert time.monotonic() < deadline, bytes(student.output[-500:])
        await student.type(b"\recho who=$(id -un)\r")
        await student.drain(3)
    prompt = time.monotonic() - started

    first = await sync_to_async(_check)(attempt, student_a, capture)
    assert first.state == RunState.DONE, first.error
    assert first.score == Decimal("0.00")

    await student.type(b"echo 'hello world' > ~/hello.txt; echo fixed=$((40+2))\r")
    await student.read_until(lambda v: v.has_output(b"fixed=42"), within=120)
    # The page's size reaches the serial line through the agent (TIOCSWINSZ on /dev/ttyS0), nothing typed.
    await student.send_json({"type": "resize", "rows": 33, "cols": 111})
    await student.read_until(lambda v: any(m["type"] == "resized" for m in v.messages), within=30)
    assert [m["via"] for m in student.messages if m["type"] == "resized"] == ["agent"]
    await student.type(b"stty size; echo sized=$((5+5))\r")
    await student.read_until(lambda v: v.has_output(b"sized=10"), within=60)
    assert b"33 111" in student.output and b"stty rows" not in student.output
    second = await sync_to_async(_check)(attempt, student_a, capture)
    assert second.state == RunState.DONE, second.error
    assert (second.score, second.max_score) == (Decimal("3.00"), Decimal("3.00"))
    await student.close()

    def stop():
        with capture(execute=True):
            attempt_stop(actor=student_a, attempt=attempt)

    await sync_to_async(stop)()
    await sync_to_async(sync_until)(attempt, AttemptState.STOPPED, timeout=120)
    deadline = time.monotonic() + 60  # the ACPI power button first, then the kill after the grace period
    while _alive(guest["qemu_pid"]):
        assert time.monotonic() < deadline, "QEMU still running after Stop"
        await asyncio.sleep(0.5)
    print(
        f"\nthrough the portal under {guest['accelerator']}: Start → agent ready {agent_ready:.1f} s, "
        f"→ console prompt answering {prompt:.1f} s"
    )


def test_a_vm_whose_qemu_dies_fails_the_attempt_and_says_it_crashed(
    vm_cluster, student_a, lab_a, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        attempt = attempt_start(actor=student_a, lab=lab_a)
    deadline = time.monotonic() + 120
    while not ((guest := vm_cluster.admin.guest(attempt.namespace, attempt.vm_name)) and guest["qemu_pid"]):
        assert time.monotonic() < deadline, "QEMU did not start"
        time.sleep(0.2)
    # Once the portal has seen the VMI run: a crash before that is KubeVirt's to restart (runStrategy Always), and
    # the student simply gets the restarted VM.
    wait_until(
        lambda: attempt.refresh_from_db() or attempt.vmi_running_at is not None,
        timeout=120,
        step=lambda: tracking.namespace_sync(namespace=attempt.namespace),
        what="the portal to see the VMI running",
    )
    os.kill(guest["qemu_pid"], signal.SIGKILL)
    sync_until(attempt, AttemptState.FAILED, timeout=60)
    assert "The VirtualMachineInstance crashed." in attempt.failure_reason, attempt.failure_reason
