"""Guests on kubesim for grading tests: an attempt whose VM runs the real agent, built with the lifecycle's own
manifest builders and the guest's cloud-init, reached only through the cluster API."""

from __future__ import annotations

import secrets
import time
from typing import Any

import websocket
from django.utils import timezone

from guest.cloud_init import render_user_data
from labs import agent_client
from labs.kubevirt import client as kube_client
from labs.kubevirt import manifests, names, operations
from labs.models import Attempt, AttemptState, Lab
from portal.models import User

AGENT_READY_TIMEOUT_S = 30.0


def ensure_namespace(name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        kube_client.core_v1().create_namespace({"metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise


def provision_vm(attempt: Attempt, *, user_data: str | None = None) -> None:
    """Create the attempt's Secret and VirtualMachine as the lifecycle does."""
    lab = attempt.lab
    labels = names.attempt_labels(
        tenant_id=attempt.tenant_id, course_id=lab.course_id, lab_id=lab.pk, attempt_id=attempt.pk
    )
    secret_name = names.cloud_init_secret_name(attempt.vm_name)
    ensure_namespace(attempt.namespace)
    operations.secret_create(
        manifests.cloud_init_secret(
            name=secret_name,
            namespace=attempt.namespace,
            labels=labels,
            user_data=user_data if user_data is not None else render_user_data(token=attempt.agent_token),
        )
    )
    operations.vm_create(
        manifests.virtual_machine(
            name=attempt.vm_name,
            namespace=attempt.namespace,
            labels=labels,
            image=lab.image,
            vcpus=attempt.vcpus,
            memory_mib=attempt.memory_mib,
            host_passthrough=False,
            cloud_init_secret=secret_name,
        )
    )


def wait_for_agent(attempt: Attempt, *, timeout_s: float = AGENT_READY_TIMEOUT_S) -> dict[str, Any]:
    """Poll the agent's health through portforward until it answers (what the lifecycle's "agent ready" does)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return agent_client.healthz(attempt)
        except agent_client.AgentError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"the agent of {attempt.vm_name} never answered: {exc.code}: {exc}") from exc
            time.sleep(0.1)


def new_attempt_on_cluster(*, lab: Lab, student: User, user_data: str | None = None, wait: bool = True) -> Attempt:
    attempt = Attempt.objects.create(
        lab=lab,
        student=student,
        tenant=lab.course.tenant,
        state=AttemptState.STARTING,
        namespace=lab.course.tenant.namespace,
        agent_token=secrets.token_urlsafe(32),
    )
    attempt.vm_name = names.vm_name(attempt.pk)
    attempt.save(update_fields=["vm_name"])
    provision_vm(attempt, user_data=user_data)
    if wait:
        wait_for_agent(attempt)
        attempt.state = AttemptState.RUNNING
        attempt.agent_ready_at = timezone.now()
        attempt.save(update_fields=["state", "agent_ready_at"])
    return attempt


def delete_vm(attempt: Attempt) -> None:
    operations.vm_delete(namespace=attempt.namespace, name=attempt.vm_name)


def type_on_console(attempt: Attempt, text: str) -> None:
    """Type into the VM's serial console as a student would (binary frames; KubeVirt drops text frames)."""
    target = kube_client.stream_target(
        kube_client.vmi_subresource_path(namespace=attempt.namespace, name=attempt.vm_name, subresource="console")
    )
    ws = websocket.create_connection(
        target.url,
        header=[f"{k}: {v}" for k, v in target.headers.items()],
        sslopt={"context": target.ssl} if target.ssl else {},
        timeout=10,
    )
    try:
        ws.send_binary(text.encode("utf-8"))
        time.sleep(0.3)  # let the shell read the line before the console goes away
    finally:
        ws.close()
