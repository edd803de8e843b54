"""An instructor's mistake in a lab's image or extra cloud-init is caught when the lab is saved, shown to the
instructor in admin, and never reaches a student as a parser's message."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from labs.models import Attempt
from labs.services import attempt_start
from portal.errors import Conflict

pytestmark = pytest.mark.django_db

NOT_YAML = "runcmd:\n  - echo hi\n bad: [unclosed\n"
WRONG_SHAPE = "runcmd: echo hi\n"  # runcmd is merged as a list


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.mark.parametrize("text", [NOT_YAML, WRONG_SHAPE])
def test_the_lab_refuses_to_be_saved_with_an_extra_cloud_init_that_cannot_be_merged(lab_a, text):
    lab_a.extra_cloud_init = text
    with pytest.raises(ValidationError) as refusal:
        lab_a.full_clean()
    assert "extra_cloud_init" in refusal.value.message_dict


@pytest.mark.parametrize("image", ["not a valid image!!", "Quay.io/Fedora:41", "quay.io/fedora:4 1", "fedora:"])
def test_the_lab_refuses_an_image_no_cluster_can_pull(lab_a, image):
    lab_a.image = image
    with pytest.raises(ValidationError) as refusal:
        lab_a.full_clean()
    assert "quay.io/containerdisks/fedora:41" in refusal.value.message_dict["image"][0]


@pytest.mark.parametrize(
    "image",
    [
        "quay.io/containerdisks/debian:12",
        "fedora",
        "localhost:5000/labs/net_tools-v2:2026.1",
        "registry.example.ac.jp/lab@sha256:" + "a" * 64,
    ],
)
def test_image_references_save(lab_a, image):
    lab_a.image = image
    lab_a.full_clean()


def test_a_valid_extra_cloud_init_saves(lab_a):
    lab_a.extra_cloud_init = "packages:\n  - tree\nruncmd:\n  - [touch, /tmp/ready]\n"
    lab_a.full_clean()


def test_admin_shows_the_instructor_the_error_at_save_and_keeps_what_they_typed(client, instructor_a, lab_a):
    client.force_login(instructor_a)
    url = reverse("admin:labs_lab_change", args=[lab_a.id])
    form = client.get(url).context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value is not None}
    data.update({"extra_cloud_init": NOT_YAML, "checks-TOTAL_FORMS": "0", "checks-INITIAL_FORMS": "0"})
    response = client.post(url, data)
    assert response.status_code == 200  # the form again, with the error
    html = response.content.decode()
    assert "not valid YAML" in html and "bad: [unclosed" in html
    lab_a.refresh_from_db()
    assert lab_a.extra_cloud_init == ""


def test_a_student_meets_a_lab_broken_before_validation_with_plain_words_and_staff_see_the_error(
    client, student_a, instructor_a, lab_a
):
    lab_a.extra_cloud_init = "- just\n- a list\n"
    lab_a.save()  # saved before save-time checks existed, or by code that skips them
    with pytest.raises(Conflict) as refusal:
        attempt_start(actor=student_a, lab=lab_a)
    assert refusal.value.code == "lab_misconfigured"
    assert "YAML" not in refusal.value.message and "mapping" not in refusal.value.message
    assert "misconfigured" in refusal.value.message
    assert not Attempt.objects.exists()
    client.force_login(instructor_a)
    html = client.get(reverse("admin:labs_lab_change", args=[lab_a.id])).content.decode()
    assert "must be a YAML mapping" in html
