"""Bodies of a shape the API cannot take: JSON nested past what the parser follows is a 400 in the error format,
not a server error."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

DEPTH = 100_000


@pytest.mark.parametrize("body", ["[" * DEPTH + "]" * DEPTH, '{"lab": ' + '{"a": ' * DEPTH + "1" + "}" * DEPTH + "}"])
def test_json_nested_too_deep_is_a_400(body, student_a, lab_a):
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(student_a)
    response = client.post("/api/v1/attempts/", data=body, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["code"] == "parse_error"
    assert "nested" in response.json()["error"]["message"]


def test_json_nested_too_deep_is_a_400_before_sign_in_too():
    body = "[" * DEPTH + "]" * DEPTH
    response = APIClient(raise_request_exception=False).post(
        "/api/v1/auth/token/", data=body, content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parse_error"
