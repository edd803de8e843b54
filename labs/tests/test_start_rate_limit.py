"""The lab page's Start obeys the same per-user start limit as the API's."""

import pytest
from django.urls import reverse

from conftest import PASSWORD
from labs.models import Attempt


@pytest.mark.django_db
def test_start_button_is_refused_past_the_per_user_limit(client, settings, lab_a, student_a):
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "attempt_start": (2, 600)}
    client.login(username=student_a.username, password=PASSWORD)
    url = reverse("labs:attempt_start", args=[lab_a.id])
    headers = {"HTTP_ACCEPT": "application/json"}

    first = client.post(url, **headers)
    assert first.status_code == 201, first.content
    second = client.post(url, **headers)  # counted, and refused for another reason: one attempt is active
    assert second.status_code == 409
    third = client.post(url, **headers)
    assert third.status_code == 429
    assert int(third["Retry-After"]) > 0
    assert "too many labs" in third.json()["error"]
    assert Attempt.objects.filter(student=student_a).count() == 1
