"""A brand-new tenant on a cluster that enforces RBAC (kubesim ``--rbac`` with deploy/rbac.yaml applied): before its
Role is applied the first Start is refused as "not ready" without making an attempt, cluster_check and the capacity
page name the namespace and what to apply; once a cluster admin applies it, the next Start runs the whole lifecycle
with the portal's own rights only."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.urls import reverse

from conftest import PASSWORD
from labs import tasks
from labs.models import Attempt, AttemptState, TenantNamespace
from labs.services import attempt_start, attempt_stop, namespaces
from labs.tests.conftest import sync_until, vm_names
from labs.tests.test_preflight import run_cluster_check

pytestmark = pytest.mark.django_db

KUBECTL = shutil.which("kubectl") or "kubectl"  # CI installs it; without it the test fails, visibly


@pytest.fixture(scope="module")
def rbac_kubesim(tmp_path_factory):
    """A kubesim whose portal token is the portal's service account, with only deploy/rbac.yaml applied."""
    from kubesim.testing import KubesimServer

    manifest = str(Path(django_settings.BASE_DIR) / "deploy" / "rbac.yaml")
    with KubesimServer(tmp_path_factory.mktemp("rbac"), rbac=True, extra_args=["--rbac-manifest", manifest]) as sim:
        yield sim


@pytest.fixture
def cluster(rbac_kubesim, settings):
    """This module's cluster in place of the session's (the ``lifecycle`` fixture builds on it)."""
    from labs.kubevirt import client as kube_client

    settings.KUBECONFIG = str(rbac_kubesim.kubeconfig)
    kube_client.reset()
    os.environ.pop("KUBERNETES_SERVICE_HOST", None)
    yield rbac_kubesim
    kube_client.reset()


def apply_tenant_manifests(sim, tenant) -> str:
    """``python manage.py tenant_manifests "<tenant>" | kubectl apply -f -`` with the admin's kubeconfig."""
    rendered = StringIO()
    call_command("tenant_manifests", tenant.name, stdout=rendered)
    applied = subprocess.run(
        [KUBECTL, "apply", "-f", "-"],
        input=rendered.getvalue(),
        env={**os.environ, "KUBECONFIG": str(sim.tls_kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr
    return applied.stdout


def test_a_new_tenants_first_start_is_refused_until_its_role_is_applied_then_runs(
    lifecycle, client, tenant_a, student_a, instructor_a, lab_a, django_capture_on_commit_callbacks
):
    from portal.errors import Conflict

    namespace = tenant_a.namespace
    assert not TenantNamespace.objects.filter(tenant=tenant_a).exists()  # never started, never swept
    with pytest.raises(Conflict) as refused:
        attempt_start(actor=student_a, lab=lab_a)
    assert refused.value.code == "course_not_ready"
    assert Attempt.objects.count() == 0  # nothing made, so nothing failed
    row = TenantNamespace.objects.get(tenant=tenant_a)
    assert (
        f'not allow the portal to create virtualmachines.kubevirt.io in the namespace "{namespace}"' in row.last_error
    )
    assert "tenant_manifests" in row.last_error

    code, output = run_cluster_check()
    assert code == 1
    assert f"The portal may not manage tenant namespace {namespace} (tenant {tenant_a.name})" in output
    assert f'python manage.py tenant_manifests "{tenant_a.name}" | kubectl apply -f -' in output

    client.login(username=instructor_a.username, password=PASSWORD)
    page = client.get(reverse("admin:labs_attempt_capacity")).content.decode()
    assert "not allow the portal to create virtualmachines.kubevirt.io" in page
    assert f'As a cluster admin, run: python manage.py tenant_manifests "{tenant_a.name}" | kubectl apply -f -' in page

    applied = apply_tenant_manifests(lifecycle, tenant_a)
    assert "role.rbac.authorization.k8s.io/lab-portal created" in applied
    with pytest.raises(Conflict):  # known for a while yet: not asked again at every Start
        attempt_start(actor=student_a, lab=lab_a)
    TenantNamespace.objects.filter(pk=row.pk).update(
        last_error_at=row.last_error_at - timedelta(seconds=namespaces.NOT_READY_RECHECK_SECONDS + 1)
    )
    attempt = attempt_start(actor=student_a, lab=lab_a)  # asked again: allowed now
    assert TenantNamespace.objects.get(pk=row.pk).last_error == ""
    assert tasks.provision_attempt(attempt.id) == "created"
    assert vm_names(namespace) == [attempt.vm_name]
    sync_until(attempt, AttemptState.RUNNING)
    assert "The portal may not manage" not in run_cluster_check()[1]

    with django_capture_on_commit_callbacks(execute=True):  # the grading and the teardown, with the portal's rights
        attempt_stop(actor=student_a, attempt=Attempt.objects.get(pk=attempt.pk))
    sync_until(attempt, AttemptState.STOPPED)
    assert vm_names(namespace) == []
