"""Fixtures for the core app's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # Every persona is created with a password; PBKDF2's million rounds would cost a third of a second each.
    # What is tested here is who may do what, not the hasher.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
