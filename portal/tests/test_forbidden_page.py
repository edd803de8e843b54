"""A page someone may not open says why and what to do, in the portal's own page (not a bare 403)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_an_instructor_refused_the_tenants_is_told_who_sets_quotas(client, instructor_a):
    client.force_login(instructor_a)
    response = client.get("/admin/portal/tenant/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "You may not open this page" in html
    assert "are set by the portal" in html and 'href="/admin/"' in html
