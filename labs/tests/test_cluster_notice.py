"""The student's lab page says in plain words when the cluster is in trouble, and says nothing when it is not."""

import pytest
from django.core.cache import cache
from django.urls import reverse

from conftest import PASSWORD
from labs.health import record_sync_success
from labs.kubevirt import client as kube_client

NOTICE = "The cluster is not answering; your lab may be slow to start."


@pytest.mark.django_db
def test_unreachable_cluster_is_announced_on_the_lab_page(client, settings, tmp_path, lab_a, student_a):
    settings.KUBECONFIG = str(tmp_path / "missing-kubeconfig")
    kube_client.reset()
    cache.clear()
    try:
        client.login(username=student_a.username, password=PASSWORD)
        page = client.get(reverse("labs:lab_detail", args=[lab_a.id]))
    finally:
        kube_client.reset()
        cache.clear()
    assert page.status_code == 200
    assert NOTICE in page.content.decode()


@pytest.mark.django_db
def test_healthy_cluster_shows_no_notice(client, cluster, lab_a, student_a):
    cache.clear()
    record_sync_success()
    client.login(username=student_a.username, password=PASSWORD)
    page = client.get(reverse("labs:lab_detail", args=[lab_a.id]))
    assert page.status_code == 200
    assert 'id="cluster-notice"' not in page.content.decode()
