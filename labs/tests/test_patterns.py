"""Checks' output patterns: matching under a time limit, and vetting when an instructor saves a check."""

from __future__ import annotations

import time

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from labs import patterns
from labs.models import Check, Lab, StdoutMatch
from portal.models import AuditEvent

CATASTROPHIC = r"^(a|a)*$"  # exponential backtracking even in the regex engine


class TestSearch:
    def test_finds_a_line_with_multiline_anchors(self):
        assert patterns.search(r"^port\s+8080$", "host a\nport 8080\nend\n")
        assert not patterns.search(r"^port\s+8080$", "port 80801\n")

    def test_catastrophic_pattern_raises_timeout_promptly(self, settings):
        settings.GRADING_PATTERN_TIMEOUT_MS = 200
        # The engine's limit counts this process's CPU time (C ``clock()``), so the bound does too: on a loaded
        # machine the wall clock stretches with the load. Uncut, this match would take hours.
        started = time.process_time()
        with pytest.raises(patterns.PatternTimeout):
            patterns.search(CATASTROPHIC, "a" * 40 + "!")
        assert time.process_time() - started < 2

    def test_input_past_the_agents_cap_is_not_searched(self):
        text = "x" * patterns.MATCH_INPUT_MAX_CHARS + "needle"
        assert not patterns.search("needle", text)
        assert patterns.search("needle", text[-patterns.MATCH_INPUT_MAX_CHARS :])


class TestPatternProblem:
    @pytest.mark.parametrize("pattern", [r"^hello\s+world$", r"(?i)ready", r"^\d{3}$", r"(\w+)\s(\w+)", r"a.*b.*c"])
    def test_sound_patterns_pass(self, pattern):
        assert patterns.pattern_problem(pattern) is None

    def test_syntax_error_is_named(self):
        assert "Not a valid regular expression" in patterns.pattern_problem("(unclosed")

    @pytest.mark.parametrize("pattern", [CATASTROPHIC, r"^(\d|\d)+$", r"(x|xx)+$"])
    def test_backtracking_patterns_are_refused(self, pattern):
        problem = patterns.pattern_problem(pattern)
        assert problem is not None and "backtracks too much" in problem


class TestCheckClean:
    def check(self, lab, pattern):
        return Check(lab=lab, title="t", command="true", stdout_match=StdoutMatch.REGEX, stdout_pattern=pattern)

    def test_catastrophic_pattern_is_a_field_error(self, lab_a):
        with pytest.raises(ValidationError) as info:
            self.check(lab_a, CATASTROPHIC).full_clean()
        assert "backtracks too much" in info.value.message_dict["stdout_pattern"][0]

    def test_sound_pattern_is_accepted(self, lab_a):
        self.check(lab_a, r"^ok$").full_clean()

    def test_a_pattern_left_with_ignore_output_is_refused_rather_than_never_compared(self, lab_a):
        check = self.check(lab_a, "600")
        check.stdout_match = StdoutMatch.NONE  # the form's default, left as it was
        with pytest.raises(ValidationError) as info:
            check.full_clean()
        assert "compared with the pattern" in info.value.message_dict["stdout_match"][0]


def test_admin_refuses_a_catastrophic_pattern_and_keeps_what_was_typed(client, instructor_a, lab_a):
    client.force_login(instructor_a)
    url = reverse("admin:labs_lab_change", args=[lab_a.pk])
    existing = list(lab_a.checks.order_by("order", "id"))
    data = {
        "course": lab_a.course_id,
        "title": lab_a.title,
        "instructions": lab_a.instructions,
        "image": lab_a.image,
        "size": lab_a.size,
        "time_limit_minutes": lab_a.time_limit_minutes,
        "late_penalty_percent_per_day": "0",
        "attempt_limit": 0,
        "idle_stop_minutes": 0,
        "grade_policy": lab_a.grade_policy,
        "extra_cloud_init": "",
        "checks-TOTAL_FORMS": len(existing) + 1,
        "checks-INITIAL_FORMS": len(existing),
        "checks-MIN_NUM_FORMS": 0,
        "checks-MAX_NUM_FORMS": 1000,
    }
    for i, check in enumerate(existing):
        data.update(
            {
                f"checks-{i}-id": check.pk,
                f"checks-{i}-lab": lab_a.pk,
                f"checks-{i}-order": check.order,
                f"checks-{i}-title": check.title,
                f"checks-{i}-command": check.command,
                f"checks-{i}-expected_exit_code": "" if check.expected_exit_code is None else check.expected_exit_code,
                f"checks-{i}-stdout_match": check.stdout_match,
                f"checks-{i}-stdout_pattern": check.stdout_pattern,
                f"checks-{i}-points": str(check.points),
                f"checks-{i}-timeout_s": check.timeout_s,
                f"checks-{i}-hint": check.hint,
            }
        )
    new = len(existing)
    data.update(
        {
            f"checks-{new}-lab": lab_a.pk,
            f"checks-{new}-order": 9,
            f"checks-{new}-title": "only a",
            f"checks-{new}-command": "cat ~/a",
            f"checks-{new}-expected_exit_code": 0,
            f"checks-{new}-stdout_match": "regex",
            f"checks-{new}-stdout_pattern": CATASTROPHIC,
            f"checks-{new}-points": "1",
            f"checks-{new}-timeout_s": 30,
            f"checks-{new}-hint": "",
        }
    )

    response = client.post(url, data)

    assert response.status_code == 200  # the form again, not a redirect and not a 500
    formset = response.context["inline_admin_formsets"][0].formset
    assert "backtracks too much" in str(formset.forms[new].errors["stdout_pattern"])
    assert formset.forms[new]["stdout_pattern"].value() == CATASTROPHIC  # nothing typed is lost
    assert "backtracks too much" in response.content.decode()
    assert not Check.objects.filter(lab=lab_a, title="only a").exists()
    assert not AuditEvent.objects.filter(action="admin.lab.checks").exists()
    assert Lab.objects.get(pk=lab_a.pk).checks.count() == len(existing)
