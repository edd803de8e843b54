"""What an instructor writing a lab learns from its admin form: what instructions may hold, how a check's command
runs and how its output is matched."""

from __future__ import annotations

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_the_lab_form_says_how_checks_run_and_how_their_output_is_matched(client, instructor_a, lab_a):
    client.force_login(instructor_a)
    html = client.get(reverse("admin:labs_lab_change", args=[lab_a.id])).content.decode()
    for words in (
        "javascript: links are removed",  # instructions
        "Run by bash as root in /home/student",  # command
        "runuser -u student -- COMMAND",
        "standard output only",  # output pattern
        "^ and $ match at each line",
        "without a hint: “This check did not pass.”",  # hint
    ):
        assert words in html, words
