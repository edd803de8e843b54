"""Each tenant's clock: pages, admin input and messages in the tenant's time zone; the default elsewhere."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from labs.models import Lab
from labs.services import attempt_start
from portal.errors import ApplicationError, Conflict
from portal.forms import TenantAdminForm
from portal.http import TenantModelBackend
from portal.models import AuditEvent, Tenant
from portal.services import user_time_zone_set
from portal.timezones import validate_time_zone

pytestmark = pytest.mark.django_db

# 23:59 in Tokyo (UTC+9, no daylight saving) on 5 December is 14:59 UTC.
DUE = datetime(2026, 12, 5, 14, 59, tzinfo=UTC)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def tokyo(tenant: Tenant) -> Tenant:
    tenant.time_zone = "Asia/Tokyo"
    tenant.save()
    return tenant


def test_a_zone_must_be_one_the_installation_knows():
    validate_time_zone("Asia/Tokyo")
    validate_time_zone("")  # the deployment's default
    for wrong in ("Mars/Olympus_Mons", "../../etc/passwd", "Asia/Tokyo "):
        with pytest.raises(ValidationError) as info:
            validate_time_zone(wrong)
        assert "is not a time zone" in info.value.messages[0]


def test_the_lab_page_shows_the_due_date_in_the_students_tenant_clock(student_a, lab_a, student_b, lab_b):
    tokyo(student_a.tenant)
    Lab.objects.filter(pk__in=[lab_a.pk, lab_b.pk]).update(due_at=DUE)

    page = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.pk])).content.decode()
    assert "Dec 5, 2026, 11:59 PM JST" in page
    assert 'data-time-zone="Asia/Tokyo"' in page  # for the times the page's scripts draw

    # The other tenant names no zone: the deployment's default, said as such.
    other = logged_in(student_b).get(reverse("labs:lab_detail", args=[lab_b.pk])).content.decode()
    assert "Dec 5, 2026, 2:59 PM UTC" in other
    assert 'data-time-zone="UTC"' in other


def test_the_dashboard_and_grades_use_the_tenant_clock_in_japanese_too(student_a, lab_a):
    tokyo(student_a.tenant)
    Lab.objects.filter(pk=lab_a.pk).update(due_at=DUE)
    client = logged_in(student_a)
    assert "Dec 5, 2026, 11:59 PM JST" in client.get(reverse("dashboard")).content.decode()
    client.cookies["django_language"] = "ja"
    assert "2026年12月5日 23:59 JST" in client.get(reverse("grading:my_grades")).content.decode()


def test_a_changed_zone_applies_at_the_next_request(student_a, lab_a):
    Lab.objects.filter(pk=lab_a.pk).update(due_at=DUE)
    client = logged_in(student_a)
    url = reverse("labs:lab_detail", args=[lab_a.pk])
    assert "2:59 PM UTC" in client.get(url).content.decode()
    tenant = student_a.tenant
    tenant.time_zone = "Europe/Berlin"
    tenant.save()
    assert "Dec 5, 2026, 3:59 PM CET" in client.get(url).content.decode()


def test_a_zone_the_installation_no_longer_knows_falls_back_to_the_default(student_a, lab_a):
    Tenant.objects.filter(pk=student_a.tenant_id).update(time_zone="Gone/Nowhere")  # as after a tzdata update
    Lab.objects.filter(pk=lab_a.pk).update(due_at=DUE)
    response = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.pk]))
    assert response.status_code == 200
    assert "Dec 5, 2026, 2:59 PM UTC" in response.content.decode()


def test_a_request_leaves_no_zone_behind_in_its_thread(student_a, lab_a, settings):
    tokyo(student_a.tenant)
    logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.pk]))
    assert timezone.get_current_timezone_name() == settings.TIME_ZONE


def test_instructors_enter_due_dates_in_their_tenant_clock(instructor_a, lab_a):
    tokyo(instructor_a.tenant)
    client = logged_in(instructor_a)
    url = reverse("admin:labs_lab_change", args=[lab_a.pk])
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
        "due_at_0": "2026-12-05",
        "due_at_1": "23:59:00",
        "checks-TOTAL_FORMS": 0,
        "checks-INITIAL_FORMS": 0,
        "checks-MIN_NUM_FORMS": 0,
        "checks-MAX_NUM_FORMS": 1000,
    }
    lab_a.checks.all().delete()

    response = client.post(url, data)

    assert response.status_code == 302, response.content.decode()[:2000]
    lab_a.refresh_from_db()
    assert lab_a.due_at == DUE
    # And the form shows it back as typed.
    form = client.get(url).content.decode()
    assert re.search(r'name="due_at_1"[^>]*value="23:59:00"|value="23:59:00"[^>]*name="due_at_1"', form)


def test_a_lab_that_opens_later_says_when_in_its_tenant_clock(student_a, lab_a):
    tokyo(student_a.tenant)
    opens = timezone.now() + timedelta(days=2)
    Lab.objects.filter(pk=lab_a.pk).update(opens_at=opens)
    lab_a.refresh_from_db()
    with pytest.raises(Conflict) as info:
        attempt_start(actor=student_a, lab=lab_a)  # as the API calls it: no page middleware involved
    expected = timezone.localtime(opens, timezone.get_fixed_timezone(9 * 60))
    assert f"{expected:%-I:%M} {expected:%p} JST" in info.value.message


def test_the_tenant_admin_offers_the_known_zones_and_refuses_others(superuser, tenant_a):
    client = logged_in(superuser)
    url = reverse("admin:portal_tenant_change", args=[tenant_a.pk])
    assert '<option value="Asia/Tokyo">Asia/Tokyo</option>' in client.get(url).content.decode()
    data = {
        "name": tenant_a.name,
        "max_concurrent_vms": 10,
        "max_vms_per_student": 0,
        "max_vcpus": 20,
        "max_memory_mib": 1024,
    }

    refused = client.post(url, {**data, "time_zone": "Mars/Olympus_Mons"})
    assert refused.status_code == 200
    assert "Select a valid choice" in refused.content.decode()
    tenant_a.refresh_from_db()
    assert tenant_a.time_zone == ""

    assert client.post(url, {**data, "time_zone": "America/Sao_Paulo"}).status_code == 302
    tenant_a.refresh_from_db()
    assert tenant_a.time_zone == "America/Sao_Paulo"


def test_the_tenant_form_keeps_a_stored_zone_the_installation_dropped_visible(tenant_a):
    Tenant.objects.filter(pk=tenant_a.pk).update(time_zone="Gone/Nowhere")
    tenant_a.refresh_from_db()
    choices = dict(TenantAdminForm(instance=tenant_a).fields["time_zone"].choices)
    assert choices["Gone/Nowhere"] == "Gone/Nowhere"
    assert choices[""].startswith("The portal's default")


def test_the_session_user_brings_its_tenant_in_the_same_query(student_a, django_assert_num_queries):
    tokyo(student_a.tenant)
    with django_assert_num_queries(1):
        user = TenantModelBackend().get_user(student_a.pk)
        assert user.tenant.time_zone == "Asia/Tokyo"


def test_sessions_signed_in_by_djangos_own_backend_stay_valid_and_zoned(student_a, lab_a):
    tokyo(student_a.tenant)
    Lab.objects.filter(pk=lab_a.pk).update(due_at=DUE)
    client = Client()
    client.force_login(student_a, backend="django.contrib.auth.backends.ModelBackend")
    response = client.get(reverse("labs:lab_detail", args=[lab_a.pk]))
    assert response.status_code == 200
    assert "Dec 5, 2026, 11:59 PM JST" in response.content.decode()


# ---- a person's own clock --------------------------------------------------------------------------------------


def test_a_person_who_chose_a_zone_sees_every_page_in_it_and_the_others_keep_the_tenants(student_a, lab_a, ta_a):
    tokyo(student_a.tenant)
    Lab.objects.filter(pk=lab_a.pk).update(due_at=DUE)
    student_a.time_zone = "Europe/Berlin"  # 14:59 UTC is 15:59 in Berlin in December (CET, UTC+1)
    student_a.save()

    page = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.pk])).content.decode()
    assert "Dec 5, 2026, 3:59 PM CET" in page
    assert 'data-time-zone="Europe/Berlin"' in page
    assert "JST" not in page
    dashboard = logged_in(student_a).get(reverse("dashboard")).content.decode()
    assert "Dec 5, 2026, 3:59 PM CET" in dashboard
    # The TA of the same course chose nothing: the tenant's clock.
    staff = logged_in(ta_a).get(reverse("dashboard")).content.decode()
    assert 'data-time-zone="Asia/Tokyo"' in staff


def test_a_personal_zone_the_installation_no_longer_knows_falls_back_to_the_tenants(student_a, lab_a):
    tokyo(student_a.tenant)
    Lab.objects.filter(pk=lab_a.pk).update(due_at=DUE)
    type(student_a).objects.filter(pk=student_a.pk).update(time_zone="Gone/Nowhere")
    page = logged_in(student_a).get(reverse("labs:lab_detail", args=[lab_a.pk])).content.decode()
    assert "Dec 5, 2026, 11:59 PM JST" in page


def test_the_header_links_to_the_time_zone_page_and_back(student_a, lab_a):
    tokyo(student_a.tenant)
    lab_url = reverse("labs:lab_detail", args=[lab_a.pk])
    page = logged_in(student_a).get(lab_url).content.decode()
    link = re.search(r'<a href="([^"]+)" class="time-zone-link"\s+title="Time zone">([^<]+)</a>', page)
    assert link is not None
    assert link.group(1) == f"{reverse('time_zone')}?next={lab_url}"
    assert link.group(2) == "Asia/Tokyo"


def test_the_time_zone_page_saves_a_known_zone_and_returns_to_the_page(student_a, lab_a):
    tokyo(student_a.tenant)
    client = logged_in(student_a)
    url = reverse("time_zone")
    lab_url = reverse("labs:lab_detail", args=[lab_a.pk])
    form = client.get(url, {"next": lab_url}).content.decode()
    assert '<option value="" selected>My institution&#x27;s (Asia/Tokyo)</option>' in form
    assert '<option value="Europe/Berlin">Europe/Berlin</option>' in form
    assert f'name="next" value="{lab_url}"' in form
    assert "These pages now use Asia/Tokyo" in form

    response = client.post(url, {"time_zone": "Europe/Berlin", "next": lab_url})
    assert response.status_code == 302 and response.url == lab_url
    student_a.refresh_from_db()
    assert student_a.time_zone == "Europe/Berlin"
    after = client.get(lab_url).content.decode()
    assert "Dates and times are now shown in Europe/Berlin." in after
    assert 'data-time-zone="Europe/Berlin"' in after

    # Back to the institution's clock: an empty choice, and the message names the zone it means.
    response = client.post(url, {"time_zone": "", "next": lab_url})
    assert response.status_code == 302
    student_a.refresh_from_db()
    assert student_a.time_zone == ""
    assert "Dates and times are now shown in Asia/Tokyo." in client.get(lab_url).content.decode()


def test_the_time_zone_page_refuses_an_unknown_zone_and_keeps_the_chosen_one(student_a):
    type(student_a).objects.filter(pk=student_a.pk).update(time_zone="Europe/Berlin")
    client = logged_in(student_a)
    refused = client.post(reverse("time_zone"), {"time_zone": "Mars/Olympus_Mons"})
    assert refused.status_code == 200
    assert "Select a valid choice" in refused.content.decode()
    student_a.refresh_from_db()
    assert student_a.time_zone == "Europe/Berlin"


@pytest.mark.parametrize("unsafe", ["https://evil.example/labs/", "//evil.example/", "javascript:alert(1)"])
def test_the_time_zone_page_returns_only_to_this_site(student_a, unsafe):
    response = logged_in(student_a).post(reverse("time_zone"), {"time_zone": "Europe/Berlin", "next": unsafe})
    assert response.status_code == 302
    assert response.url == reverse("dashboard")


def test_the_time_zone_page_needs_a_signed_in_person_and_a_csrf_token(student_a):
    anonymous = Client().get(reverse("time_zone"))
    assert anonymous.status_code == 302 and anonymous.url.startswith(reverse("login"))

    client = Client(enforce_csrf_checks=True)
    client.force_login(student_a)
    assert client.post(reverse("time_zone"), {"time_zone": "Europe/Berlin"}).status_code == 403
    student_a.refresh_from_db()
    assert student_a.time_zone == ""


def test_a_lab_that_opens_later_says_when_in_the_students_own_clock(student_a, lab_a):
    tokyo(student_a.tenant)
    student_a.time_zone = "America/New_York"
    student_a.save()
    opens = datetime(2030, 1, 15, 14, 0, tzinfo=UTC)  # 9:00 AM in New York (EST, UTC-5)
    Lab.objects.filter(pk=lab_a.pk).update(opens_at=opens)
    lab_a.refresh_from_db()
    with pytest.raises(Conflict) as info:
        attempt_start(actor=student_a, lab=lab_a)
    assert "Jan 15, 2030, 9:00 AM EST" in info.value.message


def test_the_api_answers_in_utc_however_the_client_signed_in(student_a, lab_a):
    from rest_framework.authtoken.models import Token

    from labs.models import Attempt, AttemptState

    tokyo(student_a.tenant)
    attempt = Attempt.objects.create(
        lab=lab_a, student=student_a, tenant=lab_a.course.tenant, state=AttemptState.RUNNING
    )
    Attempt.objects.filter(pk=attempt.pk).update(requested_at=DUE)
    url = reverse("api:attempt-detail", args=[attempt.pk])

    session = logged_in(student_a)
    token = Client(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=student_a).key}")
    for client in (session, token):
        body = client.get(url).json()
        assert body["timestamps"]["requested"] == "2026-12-05T14:59:00Z"

    # The person's clock is theirs to read there, though: their own, else their institution's.
    assert token.get(reverse("api:me")).json()["time_zone"] == "Asia/Tokyo"
    student_a.time_zone = "Europe/Berlin"
    student_a.save()
    assert token.get(reverse("api:me")).json()["time_zone"] == "Europe/Berlin"
    assert session.get(url).json()["timestamps"]["requested"] == "2026-12-05T14:59:00Z"


def test_instructors_set_a_persons_zone_in_admin_from_the_known_ones(instructor_a, student_a):
    client = logged_in(instructor_a)
    url = reverse("admin:portal_user_change", args=[student_a.pk])
    form = client.get(url).content.decode()
    assert '<option value="Europe/Berlin">Europe/Berlin</option>' in form
    data = {
        "username": student_a.username,
        "full_name": "Student A",
        "email": "a@example.test",
        "is_active": "on",
        "tenant": student_a.tenant_id,
    }
    refused = client.post(url, {**data, "time_zone": "Mars/Olympus_Mons"})
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    student_a.refresh_from_db()
    assert student_a.time_zone == ""
    assert client.post(url, {**data, "time_zone": "Europe/Berlin"}).status_code == 302
    student_a.refresh_from_db()
    assert student_a.time_zone == "Europe/Berlin"


def test_choosing_a_zone_writes_that_column_only(student_a):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = logged_in(student_a)
    with CaptureQueriesContext(connection) as queries:
        assert client.post(reverse("time_zone"), {"time_zone": "Europe/Berlin"}).status_code == 302
    updates = [query["sql"] for query in queries if query["sql"].startswith('UPDATE "portal_user"')]
    assert len(updates) == 1
    assert re.match(r'UPDATE "portal_user" SET "time_zone" = \S+ WHERE', updates[0])


def test_a_person_without_a_tenant_gets_the_portals_default_as_their_institutions(superuser):
    client = logged_in(superuser)
    page = client.get(reverse("time_zone")).content.decode()
    assert "My institution&#x27;s (UTC)" in page
    assert client.post(reverse("time_zone"), {"time_zone": "Asia/Kolkata"}).status_code == 302
    assert client.get(reverse("api:me")).json()["time_zone"] == "Asia/Kolkata"


def test_api_clients_choose_the_persons_clock_with_a_known_zone_only(student_a):
    from rest_framework.authtoken.models import Token

    tokyo(student_a.tenant)
    client = Client(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=student_a).key}")
    url = reverse("api:me")

    def patch(body: dict):
        return client.patch(url, data=body, content_type="application/json")

    chosen = patch({"time_zone": "Europe/Berlin"})
    assert chosen.status_code == 200 and chosen.json()["time_zone"] == "Europe/Berlin"
    refusals = (({"time_zone": "Mars/Olympus_Mons"}, "time_zone"), ({"tenant": 99}, "tenant"))
    for refused, field in refusals:
        response = patch(refused)
        assert response.status_code == 400, refused
        assert field in str(response.json()), response.json()
    # A PATCH changes what it names, as the schema says: nothing named, nothing changed.
    unchanged = patch({})
    assert unchanged.status_code == 200 and unchanged.json()["time_zone"] == "Europe/Berlin"
    student_a.refresh_from_db()
    assert student_a.time_zone == "Europe/Berlin" and student_a.tenant.time_zone == "Asia/Tokyo"
    back = patch({"time_zone": ""})
    assert back.status_code == 200 and back.json()["time_zone"] == "Asia/Tokyo"

    # A browser session must send its CSRF token, as for any other change through the API.
    session = Client(enforce_csrf_checks=True)
    session.force_login(student_a)
    assert session.patch(url, data={"time_zone": "Europe/Berlin"}, content_type="application/json").status_code == 403


def test_a_person_changing_their_time_zone_is_audited(student_a):
    client = logged_in(student_a)
    assert client.post(reverse("time_zone"), {"time_zone": "Europe/Berlin"}).status_code == 302
    event = AuditEvent.objects.get(action="user.time_zone")
    assert (event.actor, event.tenant, event.target_id) == (student_a, student_a.tenant, str(student_a.pk))
    assert event.data == {"from": "", "to": "Europe/Berlin"}


def test_the_time_zone_service_refuses_an_unknown_zone_and_changes_nothing(student_a):
    with pytest.raises(ApplicationError):
        user_time_zone_set(actor=student_a, user=student_a, time_zone="Mars/Olympus_Mons")
    student_a.refresh_from_db()
    assert student_a.time_zone == "" and not AuditEvent.objects.filter(action="user.time_zone").exists()
