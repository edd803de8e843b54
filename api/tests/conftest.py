"""Fixtures of the API tests: the two-tenant world, API clients per persona, and rate-limit counters of their
own for every test."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from api.tests.world import World, build_world, fresh_cache_settings


@pytest.fixture(autouse=True)
def isolated_cache(settings):
    settings.CACHES = fresh_cache_settings()


@pytest.fixture
def world(lab_a, lab_b, student_a, student_b, instructor_a, instructor_b, ta_a) -> World:
    return build_world(
        lab_a=lab_a,
        lab_b=lab_b,
        student_a=student_a,
        student_b=student_b,
        instructor_a=instructor_a,
        instructor_b=instructor_b,
    )


@pytest.fixture
def client_for():
    """``client_for(user)``: an API client signed in as ``user`` (``None`` for anonymous)."""

    def make(user) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user=user)
        return client

    return make
