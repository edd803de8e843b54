"""Secret fields in the admin (the agent token, password hashes, API token keys): never shown, searched or usable in
a filter of the address, where ``?agent_token__startswith=K`` would give them away one character at a time."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import Client

from labs.models import Attempt
from labs.services import attempt_start
from portal.admin_scoping import SECRET_FIELDS

pytestmark = pytest.mark.django_db


@pytest.fixture
def instructor_client(instructor_a) -> Client:
    client = Client()
    client.force_login(instructor_a)
    return client


def test_an_instructor_cannot_filter_attempts_by_their_agent_token(instructor_client, student_a, lab_a):
    attempt = attempt_start(actor=student_a, lab=lab_a)
    Attempt.objects.filter(id=attempt.id).update(agent_token="Ksecret-token")
    for query in (
        "agent_token__startswith=K",
        "agent_token__startswith=Z",
        "agent_token__regex=^K",
        "agent_token=Ksecret-token",
        "student__password__startswith=md5",
    ):
        response = instructor_client.get(f"/admin/labs/attempt/?{query}")
        assert response.status_code == 400, query
    page = instructor_client.get(f"/admin/labs/attempt/{attempt.id}/change/").content.decode()
    assert "Ksecret-token" not in page
    searched = instructor_client.get("/admin/labs/attempt/?q=Ksecret").content.decode()
    assert f"/admin/labs/attempt/{attempt.id}/change/" not in searched


def test_no_admin_shows_searches_or_filters_a_secret_field(admin_user, rf):
    request = rf.get("/admin/")
    request.user = admin_user
    checked = 0
    for model, model_admin in admin.site._registry.items():
        secrets = {field.name for field in model._meta.get_fields() if field.name in SECRET_FIELDS}
        if not secrets:
            continue
        checked += 1
        shown = set(model_admin.get_list_display(request)) | set(model_admin.get_search_fields(request))
        shown |= {item if isinstance(item, str) else item[0] for item in model_admin.get_list_filter(request)}
        shown |= set(model_admin.get_readonly_fields(request)) | set(model_admin.get_fields(request))
        assert not (secrets - {"password"}) & shown, model
        for name in secrets:
            assert not model_admin.lookup_allowed(f"{name}__startswith", "x", request), (model, name)
    assert checked >= 2
