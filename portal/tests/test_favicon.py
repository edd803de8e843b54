"""The portal's icon: every page names it, and a browser asking for /favicon.ico finds it (no 404 per page)."""

from __future__ import annotations

import re

import pytest
from django.contrib.staticfiles import finders

pytestmark = pytest.mark.django_db


def test_pages_and_admin_name_an_icon_that_exists(client, instructor_a):
    client.force_login(instructor_a)
    for path in ("/accounts/login/", "/", "/admin/"):
        html = client.get(path).content.decode()
        icon = re.search(r'<link rel="icon" href="/static/([^"]+)"', html)
        assert icon, f"{path} names no icon"
        assert finders.find(icon.group(1)), icon.group(1)


def test_favicon_ico_leads_to_the_icon(client):
    response = client.get("/favicon.ico")
    assert response.status_code in (301, 302)
    assert response["Location"].startswith("/static/img/favicon")
