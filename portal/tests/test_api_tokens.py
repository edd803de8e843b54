"""API tokens (``portal.services``): created and revoked through audited services, and revoked with a password
change, a password reset and a deactivation, whichever way it is made."""

from __future__ import annotations

import pytest
from django.contrib.auth.tokens import default_token_generator
from django.test import Client
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from conftest import PASSWORD
from portal.models import AuditEvent
from portal.services import api_token_create, api_token_revoke

pytestmark = pytest.mark.django_db
NEW_PASSWORD = "a-brand-new-passphrase-42"


def token_works(key: str) -> bool:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client.get("/api/v1/me/").status_code == 200


def test_create_and_revoke_are_audited_and_never_record_the_key(student_a):
    token = api_token_create(actor=student_a, user=student_a)
    assert api_token_create(actor=student_a, user=student_a) == token  # the same token, created once
    assert api_token_revoke(actor=student_a, user=student_a, reason="owner") is True
    assert api_token_revoke(actor=student_a, user=student_a, reason="owner") is False
    events = list(AuditEvent.objects.filter(action__startswith="api_token.").order_by("id"))
    assert [(e.action, e.actor, e.target_id, e.data) for e in events] == [
        ("api_token.create", student_a, str(student_a.pk), {}),
        ("api_token.revoke", student_a, str(student_a.pk), {"reason": "owner"}),
    ]
    assert all(token.key not in f"{e.target_repr} {e.data}" for e in events)


def test_the_token_endpoints_go_through_the_services(student_a):
    client = APIClient()
    key = client.post("/api/v1/auth/token/", {"username": "student_a", "password": PASSWORD}, format="json").json()[
        "token"
    ]
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.delete("/api/v1/me/token/").status_code == 204
    assert list(
        AuditEvent.objects.filter(action__startswith="api_token.").values_list("action", flat=True).order_by("id")
    ) == ["api_token.create", "api_token.revoke"]


def test_a_password_change_revokes_the_token(student_a):
    key = api_token_create(actor=student_a, user=student_a).key
    client = Client()
    client.force_login(student_a)
    response = client.post(
        "/accounts/password_change/",
        {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert response.status_code == 302
    assert not token_works(key)
    assert AuditEvent.objects.get(action="api_token.revoke").data == {"reason": "password_changed"}


def test_a_password_reset_revokes_the_token(student_a):
    key = api_token_create(actor=student_a, user=student_a).key
    client = Client()
    uid = urlsafe_base64_encode(force_bytes(student_a.pk))
    response = client.get(f"/accounts/reset/{uid}/{default_token_generator.make_token(student_a)}/", follow=True)
    form_url = response.redirect_chain[-1][0]
    response = client.post(form_url, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert response.status_code == 302, response.content[:500]
    assert not token_works(key)
    assert not Token.objects.filter(user=student_a).exists()


def test_deactivation_revokes_the_token_and_other_saves_keep_it(student_a):
    key = api_token_create(actor=student_a, user=student_a).key
    student_a.full_name = "Renamed"
    student_a.save()
    assert token_works(key)
    student_a.is_active = False
    student_a.save(update_fields=["is_active"])
    assert not Token.objects.filter(key=key).exists()
    assert AuditEvent.objects.get(action="api_token.revoke").data == {"reason": "deactivated"}


def test_set_password_anywhere_revokes_the_token(student_a):
    api_token_create(actor=student_a, user=student_a)
    student_a.set_password(NEW_PASSWORD)
    student_a.save()
    assert not Token.objects.filter(user=student_a).exists()
