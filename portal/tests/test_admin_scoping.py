"""Admin scoping: a staff instructor of tenant A reaches nothing of tenant B (nor of courses they do not teach)
by changelist, change/delete/history URL, autocomplete, foreign-key choices or list filters, cannot grant
themselves rights, and their new courses and accounts land in their own tenant."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone

from conftest import make_lab
from grading.models import CheckResult, Grade, GradingRun, RunState
from labs.models import Attempt, AttemptState, Check, Lab
from labs.pool_models import LabPool, PoolMode
from portal.models import AuditEvent, Course, Membership, Role, Tenant, User
from portal.services import audit_record

# Text that appears only in tenant B's objects (see the world fixtures below and the personas in conftest).
TENANT_B_MARKERS = (
    "Tenant B College",
    "NET201",
    "Networks",
    "Routing",
    "student_b",
    "instructor_b",
    "Student B",
    "Instructor B",
    "b-secret-check",
    "vm-b-secret",
)


def assert_no_tenant_b(response) -> None:
    body = response.content.decode()
    leaked = [marker for marker in TENANT_B_MARKERS if marker in body]
    assert not leaked, f"{response.request['PATH_INFO']} shows tenant B: {leaked}"


def make_world(*, tenant: Tenant, course: Course, lab: Lab, student: User, vm_name: str, check_title: str) -> dict:
    """One object of every admin-registered model, all hanging off ``course``."""
    attempt = Attempt.objects.create(
        lab=lab,
        student=student,
        tenant=tenant,
        state=AttemptState.RUNNING,
        vm_name=vm_name,
        namespace=tenant.namespace,
        phase="Running",
        node_name="node-1",
        expires_at=timezone.now() + timedelta(minutes=30),
        agent_token="token-must-never-show",
    )
    run = GradingRun.objects.create(attempt=attempt, state=RunState.DONE, score=Decimal(1), max_score=Decimal(3))
    result = CheckResult.objects.create(run=run, check_ref=lab.checks.first(), check_title=check_title, passed=True)
    grade = Grade.objects.create(lab=lab, student=student, source_run=run, score=Decimal(1), max_score=Decimal(3))
    event = audit_record(actor=None, action="test.event", target=course, tenant=tenant, course=course)
    return {
        Tenant: tenant,
        Course: course,
        Membership: Membership.objects.get(user=student, course=course),
        User: student,
        Lab: lab,
        Attempt: attempt,
        GradingRun: run,
        CheckResult: result,
        Grade: grade,
        AuditEvent: event,
        LabPool: LabPool.objects.create(lab=lab, mode=PoolMode.ALWAYS, size=2),
    }


@pytest.fixture
def world_a(tenant_a, course_a, lab_a, student_a, instructor_a, ta_a) -> dict:
    return make_world(
        tenant=tenant_a, course=course_a, lab=lab_a, student=student_a, vm_name="vm-a-1", check_title="a-visible-check"
    )


@pytest.fixture
def world_b(tenant_b, course_b, lab_b, student_b, instructor_b) -> dict:
    return make_world(
        tenant=tenant_b,
        course=course_b,
        lab=lab_b,
        student=student_b,
        vm_name="vm-b-secret",
        check_title="b-secret-check",
    )


@pytest.fixture
def instructor_client(client, instructor_a):
    client.force_login(instructor_a)
    return client


def admin_url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def portal_models() -> list[type]:
    return [model for model in admin.site._registry if model._meta.app_label in {"portal", "labs", "grading"}]


def test_every_registered_model_is_covered_by_the_worlds(world_a, world_b):
    # A model registered later without an object here would escape the scoping tests below.
    assert set(portal_models()) <= set(world_b)


def test_changelists_show_tenant_a_and_nothing_of_tenant_b(instructor_client, world_a, world_b):
    visible = 0
    for model in portal_models():
        response = instructor_client.get(admin_url(model, "changelist"))
        if model is Tenant:
            assert response.status_code == 403
            continue
        assert response.status_code == 200, model
        assert_no_tenant_b(response)
        # The scoped queryset still shows tenant A's object: the page is not simply empty.
        assert response.context["cl"].result_count >= 1, model
        assert world_a[model].pk in {obj.pk for obj in response.context["cl"].result_list}, model
        visible += 1
    assert visible == len(portal_models()) - 1


def test_change_delete_and_history_urls_of_tenant_b_never_show_the_object(instructor_client, world_a, world_b):
    index = reverse("admin:index")
    for model, obj in world_b.items():
        for view in ("change", "delete", "history"):
            response = instructor_client.get(admin_url(model, view, obj.pk))
            assert response.status_code in {302, 403, 404}, (model, view, response.status_code)
            if response.status_code == 302:
                assert response["Location"] == index, (model, view)
            assert_no_tenant_b(response)


def test_posting_to_tenant_b_change_urls_changes_nothing(instructor_client, world_b, course_b, lab_b):
    response = instructor_client.post(
        admin_url(Course, "change", course_b.pk), {"code": "HACKED", "title": "Hacked", "term": ""}
    )
    assert response.status_code in {302, 403, 404}
    response = instructor_client.post(admin_url(Lab, "delete", lab_b.pk), {"post": "yes"})
    assert response.status_code in {302, 403, 404}
    course_b.refresh_from_db()
    assert course_b.code == "NET201"
    assert Lab.objects.filter(pk=lab_b.pk).exists()


def test_course_of_the_same_tenant_taught_by_someone_else_is_out_of_reach(instructor_client, tenant_a, world_a):
    other = Course.objects.create(tenant=tenant_a, code="DB300", title="Databases elsewhere")
    response = instructor_client.get(admin_url(Course, "changelist"))
    assert "DB300" not in response.content.decode()
    response = instructor_client.get(admin_url(Course, "change", other.pk))
    assert response.status_code == 302


def test_user_password_change_of_tenant_b_user_is_unreachable(instructor_client, student_b):
    response = instructor_client.get(reverse("admin:auth_user_password_change", args=[student_b.pk]))
    assert response.status_code in {302, 403, 404}
    assert_no_tenant_b(response)


def autocomplete(client, *, app_label: str, model_name: str, field_name: str, term: str = ""):
    return client.get(
        reverse("admin:autocomplete"),
        {
            "app_label": app_label,
            "model_name": model_name,
            "field_name": field_name,
            "term": term,
        },
    )


def test_autocomplete_offers_only_tenant_a(instructor_client, world_a, world_b, instructor_a, ta_a, student_a):
    users = autocomplete(instructor_client, app_label="portal", model_name="membership", field_name="user")
    assert users.status_code == 200
    assert {row["text"] for row in users.json()["results"]} == {str(instructor_a), str(ta_a), str(student_a)}
    assert_no_tenant_b(users)

    searched = autocomplete(
        instructor_client, app_label="portal", model_name="membership", field_name="user", term="student"
    )
    assert [row["id"] for row in searched.json()["results"]] == [str(student_a.pk)]

    courses = autocomplete(instructor_client, app_label="portal", model_name="membership", field_name="course")
    assert [row["id"] for row in courses.json()["results"]] == [str(world_a[Course].pk)]

    # Any source field pointing at users or courses goes through the same scoped querysets.
    students = autocomplete(instructor_client, app_label="labs", model_name="attempt", field_name="student")
    assert str(world_b[User].pk) not in {row["id"] for row in students.json()["results"]}
    tenants = autocomplete(instructor_client, app_label="portal", model_name="course", field_name="tenant")
    assert tenants.status_code == 403


def test_foreign_key_choices_on_lab_membership_and_check_forms(
    instructor_client, world_a, world_b, course_a, student_a, ta_a, instructor_a
):
    lab_form = instructor_client.get(admin_url(Lab, "add")).context["adminform"].form
    assert list(lab_form.fields["course"].queryset) == [course_a]

    membership_form = instructor_client.get(admin_url(Membership, "add")).context["adminform"].form
    assert list(membership_form.fields["course"].queryset) == [course_a]
    assert set(membership_form.fields["user"].queryset) == {student_a, ta_a, instructor_a}

    lab_page = instructor_client.get(admin_url(Lab, "change", world_a[Lab].pk))
    assert lab_page.status_code == 200
    assert_no_tenant_b(lab_page)
    check_formset = lab_page.context["inline_admin_formsets"][0].formset
    assert check_formset.model is Check
    assert {form.instance.lab_id for form in check_formset.forms if form.instance.pk} == {world_a[Lab].pk}


def lab_post_data(*, course: Course, title: str, check_title: str = "file exists") -> dict:
    return {
        "course": course.pk,
        "title": title,
        "instructions": "Do it.",
        "image": "quay.io/containerdisks/fedora:41",
        "size": "small",
        "time_limit_minutes": 60,
        "idle_stop_minutes": 0,
        "late_penalty_percent_per_day": "0",
        "attempt_limit": 0,
        "grade_policy": "best",
        "extra_cloud_init": "",
        "checks-TOTAL_FORMS": 1,
        "checks-INITIAL_FORMS": 0,
        "checks-MIN_NUM_FORMS": 0,
        "checks-MAX_NUM_FORMS": 1000,
        "checks-0-order": 1,
        "checks-0-title": check_title,
        "checks-0-command": "test -f ~/x",
        "checks-0-expected_exit_code": 0,
        "checks-0-stdout_match": "none",
        "checks-0-stdout_pattern": "",
        "checks-0-points": "1",
        "checks-0-timeout_s": 30,
        "checks-0-hint": "",
    }


def test_a_lab_cannot_be_put_in_a_tenant_b_course(instructor_client, course_b):
    response = instructor_client.post(admin_url(Lab, "add"), lab_post_data(course=course_b, title="Sneaky"))
    assert response.status_code == 200
    assert "course" in response.context["adminform"].form.errors
    assert not Lab.objects.filter(title="Sneaky").exists()


def test_instructor_adds_a_lab_with_checks_in_their_course(instructor_client, course_a, instructor_a):
    response = instructor_client.post(admin_url(Lab, "add"), lab_post_data(course=course_a, title="New lab"))
    assert response.status_code == 302
    lab = Lab.objects.get(title="New lab")
    assert lab.course == course_a
    assert list(lab.checks.values_list("title", flat=True)) == ["file exists"]
    assert AuditEvent.objects.filter(action="admin.lab.add", course=course_a, actor=instructor_a).exists()


def test_membership_with_a_tenant_b_user_is_refused(instructor_client, course_a, student_b):
    response = instructor_client.post(
        admin_url(Membership, "add"), {"user": student_b.pk, "course": course_a.pk, "role": Role.STUDENT}
    )
    assert response.status_code == 200
    assert "user" in response.context["adminform"].form.errors
    assert not Membership.objects.filter(user=student_b, course=course_a).exists()


def test_instructor_enrols_a_tenant_user_and_the_role_change_is_audited(
    instructor_client, course_a, tenant_a, instructor_a
):
    newcomer = User.objects.create_user(username="newcomer", tenant=tenant_a, email="n@example.test")
    response = instructor_client.post(
        admin_url(Membership, "add"), {"user": newcomer.pk, "course": course_a.pk, "role": Role.STUDENT}
    )
    assert response.status_code == 302
    membership = Membership.objects.get(user=newcomer, course=course_a)
    response = instructor_client.post(admin_url(Membership, "change", membership.pk), {"role": Role.INSTRUCTOR})
    assert response.status_code == 302
    membership.refresh_from_db()
    newcomer.refresh_from_db()
    assert membership.role == Role.INSTRUCTOR
    assert newcomer.is_staff  # instructors reach the admin; what they see there still follows memberships
    event = AuditEvent.objects.get(action="membership.role", actor=instructor_a)
    assert event.data == {"user": "newcomer", "from": "student", "to": "instructor"}


def test_list_filters_offer_only_reachable_courses(instructor_client, instructor_a, tenant_a, world_a, world_b):
    # A filter with a single choice is hidden; with two taught courses it shows, and must show only those.
    second = Course.objects.create(tenant=tenant_a, code="LNX102", title="More Linux")
    Membership.objects.create(user=instructor_a, course=second, role=Role.INSTRUCTOR)
    make_lab(second, title="Second lab")
    for model in (Membership, Lab, Attempt, GradingRun, Grade):
        response = instructor_client.get(admin_url(model, "changelist"))
        choices = [
            choice["display"]
            for spec in response.context["cl"].filter_specs
            for choice in spec.choices(response.context["cl"])
        ]
        if model in (Membership, Lab):  # the models with rows in both taught courses
            assert "LNX101 Linux basics (2026 fall)" in [str(choice) for choice in choices], model
        # Filters list only what the scoped queryset holds: a leak would add tenant B's course here.
        assert not any("NET201" in str(choice) or str(choice) == "Routing" for choice in choices), model
    # Asking the filter for tenant B's course by id yields nothing rather than its rows.
    response = instructor_client.get(admin_url(Membership, "changelist"), {"course__id__exact": world_b[Course].pk})
    assert_no_tenant_b(response)
    assert response.context is None or response.context["cl"].result_count == 0


def test_instructor_cannot_make_anyone_superuser_or_move_them(instructor_client, student_a, tenant_b):
    page = instructor_client.get(admin_url(User, "change", student_a.pk))
    assert page.status_code == 200
    form = page.context["adminform"].form
    assert not {"is_superuser", "is_staff", "groups", "user_permissions", "tenant"} & set(form.fields)
    response = instructor_client.post(
        admin_url(User, "change", student_a.pk),
        {
            "username": "student_a",
            "full_name": "Student A",
            "email": "student_a@example.test",
            "is_active": "on",
            "is_superuser": "on",
            "is_staff": "on",
            "tenant": tenant_b.pk,
        },
    )
    assert response.status_code == 302
    student_a.refresh_from_db()
    assert (student_a.is_superuser, student_a.is_staff, student_a.tenant.name) == (False, False, "Tenant A University")


def test_instructor_cannot_edit_their_own_rights(instructor_client, instructor_a):
    page = instructor_client.get(admin_url(User, "change", instructor_a.pk))
    # Their own account is staff: shown read-only, and a post is refused.
    assert page.status_code == 200
    assert 'name="is_superuser"' not in page.content.decode()
    response = instructor_client.post(
        admin_url(User, "change", instructor_a.pk),
        {
            "username": "instructor_a",
            "is_active": "on",
            "is_superuser": "on",
        },
    )
    assert response.status_code == 403
    instructor_a.refresh_from_db()
    assert not instructor_a.is_superuser


def test_student_of_a_colleagues_course_cannot_be_changed(instructor_client, tenant_a, world_a):
    other = Course.objects.create(tenant=tenant_a, code="DB300", title="Databases")
    theirs = User.objects.create_user(username="theirs", tenant=tenant_a)
    Membership.objects.create(user=theirs, course=other, role=Role.STUDENT)
    assert instructor_client.get(admin_url(User, "change", theirs.pk)).status_code == 200  # visible to enrol
    response = instructor_client.post(admin_url(User, "change", theirs.pk), {"username": "renamed"})
    assert response.status_code == 403
    assert User.objects.filter(username="theirs").exists()


def test_users_added_by_an_instructor_land_in_their_tenant_without_rights(instructor_client, tenant_a, tenant_b):
    response = instructor_client.post(
        admin_url(User, "add"),
        {
            "username": "fresh",
            "email": "fresh@example.test",
            "full_name": "Fresh Person",
            "usable_password": "false",
            "tenant": tenant_b.pk,
            "is_superuser": "on",
            "is_staff": "on",
        },
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    fresh = User.objects.get(username="fresh")
    assert (fresh.tenant, fresh.is_staff, fresh.is_superuser, fresh.has_usable_password()) == (
        tenant_a,
        False,
        False,
        False,
    )


def test_add_course_lands_in_the_instructors_tenant(instructor_client, instructor_a, tenant_a, tenant_b):
    add_page = instructor_client.get(admin_url(Course, "add"))
    assert "tenant" not in add_page.context["adminform"].form.fields
    response = instructor_client.post(
        admin_url(Course, "add"), {"code": "SEC400", "title": "Security", "term": "2027", "tenant": tenant_b.pk}
    )
    assert response.status_code == 302
    course = Course.objects.get(code="SEC400")
    assert course.tenant == tenant_a
    assert Membership.objects.get(course=course, user=instructor_a).role == Role.INSTRUCTOR
    assert AuditEvent.objects.filter(action="course.create", course=course, actor=instructor_a).exists()
    # ... and the instructor can open it right away.
    assert instructor_client.get(admin_url(Course, "change", course.pk)).status_code == 200


def test_duplicate_course_code_is_a_form_error_not_a_crash(instructor_client, course_a):
    response = instructor_client.post(
        admin_url(Course, "add"), {"code": course_a.code, "title": "Again", "term": course_a.term}
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.non_field_errors()
    assert Course.objects.filter(code=course_a.code).count() == 1


def test_attempts_are_read_only_and_never_show_the_agent_token(instructor_client, world_a):
    attempt = world_a[Attempt]
    page = instructor_client.get(admin_url(Attempt, "change", attempt.pk))
    assert page.status_code == 200
    body = page.content.decode()
    assert "token-must-never-show" not in body
    assert "node-1" in body and "vm-a-1" in body
    assert 'name="_save"' not in body
    assert instructor_client.post(admin_url(Attempt, "change", attempt.pk), {"state": "stopped"}).status_code == 403
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING
    changelist = instructor_client.get(admin_url(Attempt, "changelist")).content.decode()
    for column in ("Running", "node-1", "Linux basics"):
        assert column in changelist


def test_tenant_admin_is_superuser_only(instructor_client, client, superuser, tenant_a, tenant_b):
    assert instructor_client.get(admin_url(Tenant, "change", tenant_a.pk)).status_code == 403
    client.force_login(superuser)
    assert client.get(admin_url(Tenant, "change", tenant_a.pk)).status_code == 200


def test_superuser_sees_every_tenant(client, superuser, world_a, world_b):
    client.force_login(superuser)
    for model in portal_models():
        response = client.get(admin_url(model, "changelist"))
        assert response.status_code == 200, model
        pks = {obj.pk for obj in response.context["cl"].result_list}
        assert {world_a[model].pk, world_b[model].pk} <= pks, model


def test_staff_ta_and_staff_student_get_nothing(client, ta_a, student_a, world_a):
    for person in (ta_a, student_a):
        person.is_staff = True
        person.save(update_fields=["is_staff"])
        client.force_login(person)
        index = client.get(reverse("admin:index"))
        assert index.status_code == 200
        assert index.context["app_list"] == []
        for model in portal_models():
            assert client.get(admin_url(model, "changelist")).status_code == 403, (person, model)


def test_admin_index_lists_the_instructors_models_but_not_tenants(instructor_client, world_a):
    index = instructor_client.get(reverse("admin:index"))
    names = {model["object_name"] for app in index.context["app_list"] for model in app["models"]}
    assert {"Course", "Membership", "User", "Lab", "Attempt", "GradingRun", "Grade"} <= names
    assert "Tenant" not in names and "Group" not in names


def test_set_password_links_only_for_people_the_instructor_manages(instructor_client, student_a, ta_a, instructor_a):
    response = instructor_client.post(
        admin_url(User, "changelist"),
        {
            "action": "issue_password_links",
            "_selected_action": [student_a.pk, instructor_a.pk],
        },
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert "/accounts/reset/" in body and "student_a" in body
    assert [row["username"] for row in response.context["links"]] == ["student_a"]
    assert "no-store" in response["Cache-Control"]  # the links are shown once, never cached
    assert AuditEvent.objects.filter(action="user.password_link", target_id=str(student_a.pk)).exists()
