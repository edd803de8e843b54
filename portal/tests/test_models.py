"""Core model rules: namespaces are server-generated DNS-1123 labels; memberships are unique."""

import re

import pytest
from django.db import IntegrityError, transaction

from portal.models import Membership, Role, Tenant

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["Demo University", "東京工業大学", "  --Weird__Name!!  ", "x" * 200])
def test_namespace_is_generated_and_dns1123(name):
    tenant = Tenant.objects.create(name=name)
    assert DNS1123_LABEL.match(tenant.namespace)
    assert len(tenant.namespace) <= 63
    assert tenant.namespace.startswith("lab-")


@pytest.mark.django_db
def test_two_tenants_with_similar_names_get_different_namespaces():
    first = Tenant.objects.create(name="Demo")
    second = Tenant.objects.create(name="demo!")
    assert first.namespace != second.namespace


@pytest.mark.django_db
def test_duplicate_membership_is_rejected(student_a, course_a):
    with pytest.raises(IntegrityError), transaction.atomic():
        Membership.objects.create(user=student_a, course=course_a, role=Role.TA)
