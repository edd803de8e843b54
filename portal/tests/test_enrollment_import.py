"""Enrollment import from CSV: a good file creates accounts and memberships; any bad row imports nothing and
every bad row is named by its line number; UTF-8 with a BOM and Japanese names, headers and roles work."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.tokens import default_token_generator
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from portal.enrollment import MAX_FILE_BYTES
from portal.enrollment_import import enrollment_import
from portal.errors import ApplicationError
from portal.models import AuditEvent, Membership, Role, User

GOOD = (
    "username,email,name,role\n"
    "alice,alice@example.test,Alice Liddell,student\n"
    "bob,bob@example.test,Bob Builder,ta\n"
    "carol,carol@example.test,Carol Danvers,instructor\n"
)


def import_error_lines(exc: ApplicationError) -> list[int | None]:
    return [error["line"] for error in exc.extra["errors"]]


def test_good_file_creates_accounts_and_memberships(course_a, instructor_a):
    result = enrollment_import(actor=instructor_a, course=course_a, csv_file=GOOD.encode())

    assert (result.accounts_created, result.memberships_created, result.unchanged) == (3, 3, 0)
    people = {user.username: user for user in User.objects.filter(username__in=["alice", "bob", "carol"])}
    assert {user.tenant_id for user in people.values()} == {course_a.tenant_id}
    assert people["alice"].full_name == "Alice Liddell" and people["alice"].email == "alice@example.test"
    assert not any(user.has_usable_password() for user in people.values())
    roles = dict(
        Membership.objects.filter(course=course_a, user__in=people.values()).values_list("user__username", "role")
    )
    assert roles == {"alice": Role.STUDENT, "bob": Role.TA, "carol": Role.INSTRUCTOR}
    # The new instructor can open the admin; students and TAs cannot.
    assert (people["carol"].is_staff, people["bob"].is_staff, people["alice"].is_staff) == (True, False, False)
    # Each new person gets a working one-time set-password token.
    for person in result.people:
        assert default_token_generator.check_token(person.user, person.password_setup.token)
    event = AuditEvent.objects.get(action="enrollment.import", course=course_a)
    assert event.actor == instructor_a
    assert sorted(event.data["accounts_created"]) == ["alice", "bob", "carol"]


def test_importing_the_same_file_twice_changes_nothing(course_a, instructor_a):
    enrollment_import(actor=instructor_a, course=course_a, csv_file=GOOD.encode())
    users_before = User.objects.count()
    again = enrollment_import(actor=instructor_a, course=course_a, csv_file=GOOD.encode())
    assert (again.accounts_created, again.memberships_created, again.unchanged) == (0, 0, 3)
    assert User.objects.count() == users_before
    assert all(person.password_setup is None for person in again.people)


def test_one_bad_row_imports_nothing_and_names_the_line(course_a, instructor_a):
    bad = GOOD.replace("bob,bob@example.test", "bob,not-an-email")
    users_before, memberships_before = User.objects.count(), Membership.objects.count()
    with pytest.raises(ApplicationError) as caught:
        enrollment_import(actor=instructor_a, course=course_a, csv_file=bad.encode())
    assert caught.value.code == "enrollment_invalid"
    assert import_error_lines(caught.value) == [3]
    assert "not-an-email" in caught.value.extra["errors"][0]["message"]
    assert "1 line" in caught.value.message
    assert (User.objects.count(), Membership.objects.count()) == (users_before, memberships_before)
    assert not AuditEvent.objects.filter(action="enrollment.import").exists()


def test_every_bad_row_is_reported(course_a, instructor_a, student_a, ta_a, student_b):
    text = (
        "username,email,name,role\n"  # 1
        "dora,dora@example.test,Dora Explorer,student\n"  # 2 good
        ",nobody@example.test,No Name,student\n"  # 3 missing username
        "erin,erin@example,Erin,student\n"  # 4 bad email
        "fred,fred@example.test,Fred,professor\n"  # 5 unknown role
        "dora,dora2@example.test,Dora Again,student\n"  # 6 duplicate in file
        "student_b,student_b@example.test,Somebody,student\n"  # 7 another tenant's username
        "ta_a,ta_a@example.test,Ta A,student\n"  # 8 already in course as TA
        "student_a,someone.else@example.test,Student A,student\n"  # 9 existing account, other email
        "gina,gina@example.test\n"  # 10 too few values
        "\n"  # 11 blank: ignored
        "hugo,hugo@example.test,,student\n"  # 12 missing name
    )
    with pytest.raises(ApplicationError) as caught:
        enrollment_import(actor=instructor_a, course=course_a, csv_file=text.encode())
    assert import_error_lines(caught.value) == [3, 4, 5, 6, 7, 8, 9, 10, 12]
    messages = {error["line"]: error["message"] for error in caught.value.extra["errors"]}
    assert "already appears on line 2" in messages[6]
    assert "already taken" in messages[7] and "Tenant B" not in messages[7]
    assert "Teaching assistant" in messages[8]
    assert "professor" in messages[5]
    assert not User.objects.filter(username__in=["dora", "erin", "hugo"]).exists()
    assert Membership.objects.get(user=ta_a, course=course_a).role == Role.TA


def test_existing_account_of_the_tenant_is_enrolled_as_it_is(course_a, instructor_a, tenant_a):
    existing = User.objects.create_user(
        username="ivy", email="Ivy@Example.test", full_name="Ivy", tenant=tenant_a, password="ivy-own-password"
    )
    result = enrollment_import(
        actor=instructor_a,
        course=course_a,
        csv_file=b"username,email,name,role\nivy,ivy@example.test,Ivy Other Name,student\n",
    )
    assert (result.accounts_created, result.memberships_created) == (0, 1)
    existing.refresh_from_db()
    assert existing.full_name == "Ivy" and existing.has_usable_password()
    assert Membership.objects.get(user=existing, course=course_a).role == Role.STUDENT


def test_japanese_names_headers_and_roles_in_utf8_with_bom(course_a, instructor_a):
    text = (
        "ユーザー名,メールアドレス,氏名,役割\r\n"
        "tanaka.hanako,hanako@example.ac.jp,田中 花子,学生\r\n"
        "suzuki.ichiro,ichiro@example.ac.jp,鈴木 一郎,ＴＡ\r\n"
        "yamada.sensei,yamada@example.ac.jp,山田 太郎,教員\r\n"
    )
    result = enrollment_import(actor=instructor_a, course=course_a, csv_file=text.encode("utf-8-sig"))
    assert result.accounts_created == 3
    hanako = User.objects.get(username="tanaka.hanako")
    assert hanako.full_name == "田中 花子"
    assert dict(
        Membership.objects.filter(
            course=course_a, user__username__in=["tanaka.hanako", "suzuki.ichiro", "yamada.sensei"]
        ).values_list("user__username", "role")
    ) == {"tanaka.hanako": Role.STUDENT, "suzuki.ichiro": Role.TA, "yamada.sensei": Role.INSTRUCTOR}


def test_a_shift_jis_file_is_refused_with_the_line_and_how_to_fix_it(course_a, instructor_a):
    text = "username,email,name,role\ntanaka,t@example.ac.jp,田中 花子,student\n"
    with pytest.raises(ApplicationError) as caught:
        enrollment_import(actor=instructor_a, course=course_a, csv_file=text.encode("cp932"))
    assert import_error_lines(caught.value) == [2]
    assert "CSV UTF-8" in caught.value.extra["errors"][0]["message"]
    assert not User.objects.filter(username="tanaka").exists()


@pytest.mark.parametrize(
    "text, line",
    [
        ("alice,alice@example.test,Alice,student\n", 1),  # no header
        ("username,email,role\nalice,a@example.test,student\n", 1),
        ("", None),
        ("username,email,name,role\n", None),
    ],
)
def test_header_problems(course_a, instructor_a, text, line):
    with pytest.raises(ApplicationError) as caught:
        enrollment_import(actor=instructor_a, course=course_a, csv_file=text.encode())
    assert import_error_lines(caught.value) == [line]


def test_an_oversized_file_is_refused(course_a, instructor_a):
    text = GOOD + "x" * MAX_FILE_BYTES
    with pytest.raises(ApplicationError) as caught:
        enrollment_import(actor=instructor_a, course=course_a, csv_file=text.encode())
    assert "MB" in caught.value.extra["errors"][0]["message"]


def upload(content: bytes, name: str = "people.csv") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="text/csv")


def import_url(course) -> str:
    return reverse("admin:portal_course_enrollment_import", args=[course.pk])


def test_admin_page_is_reachable_from_the_course_and_imports(client, instructor_a, course_a):
    client.force_login(instructor_a)
    change_page = client.get(reverse("admin:portal_course_change", args=[course_a.pk]))
    assert import_url(course_a) in change_page.content.decode()

    response = client.post(import_url(course_a), {"csv_file": upload(GOOD.encode("utf-8-sig"))})
    assert response.status_code == 200
    assert [row["username"] for row in response.context["links"]] == ["alice", "bob", "carol"]
    assert "no-store" in response["Cache-Control"]

    # The link lets the new person choose a password and log in with it.
    link = response.context["links"][0]["link"]
    path = re.sub(r"^https?://[^/]+", "", link)
    client.logout()
    form_page = client.get(path, follow=True)
    assert form_page.status_code == 200
    set_password_url = form_page.redirect_chain[-1][0]
    done = client.post(
        set_password_url, {"new_password1": "a-long-fresh-pass-42", "new_password2": "a-long-fresh-pass-42"}
    )
    assert done.status_code == 302
    assert client.login(username="alice", password="a-long-fresh-pass-42")
    # ... and the link is spent.
    client.logout()
    assert client.get(path, follow=True).context["validlink"] is False


def test_admin_page_counts_one_person_in_words_that_fit_one(client, instructor_a, course_a):
    client.force_login(instructor_a)
    one = "username,email,name,role\nalice,alice@example.test,Alice Liddell,student\n"
    body = client.post(import_url(course_a), {"csv_file": upload(one.encode())}).content.decode()
    assert "New accounts: 1; new memberships: 1; already enrolled: 0." in body


def test_admin_page_reports_every_bad_line_and_imports_nothing(client, instructor_a, course_a):
    client.force_login(instructor_a)
    bad = GOOD.replace("Bob Builder,ta", "Bob Builder,wizard").replace("carol@example.test", "carol@")
    response = client.post(import_url(course_a), {"csv_file": upload(bad.encode())})
    assert response.status_code == 200
    assert [error["line"] for error in response.context["row_errors"]] == [3, 4]
    body = response.content.decode()
    assert "wizard" in body and "carol@" in body
    assert not User.objects.filter(username__in=["alice", "bob", "carol"]).exists()


def test_admin_page_of_another_tenants_course_is_not_found(client, instructor_b, course_a):
    client.force_login(instructor_b)
    assert client.get(import_url(course_a)).status_code == 404
    response = client.post(import_url(course_a), {"csv_file": upload(GOOD.encode())})
    assert response.status_code == 404
    assert not User.objects.filter(username="alice").exists()


def test_ta_cannot_import(client, ta_a, course_a):
    ta_a.is_staff = True
    ta_a.save(update_fields=["is_staff"])
    client.force_login(ta_a)
    assert client.get(import_url(course_a)).status_code == 404


def test_admin_import_page_speaks_the_users_language(client, instructor_a, course_a):
    # The page and its error list are rendered in the request's language (Django's own admin strings are already
    # translated into Japanese; the portal's follow from the ja catalogue).
    client.force_login(instructor_a)
    bad = GOOD.replace("Bob Builder,ta", "Bob Builder,wizard")
    response = client.post(import_url(course_a), {"csv_file": upload(bad.encode())}, HTTP_ACCEPT_LANGUAGE="ja")
    assert response.status_code == 200
    assert response.headers["Content-Language"] == "ja"
    assert "ホーム" in response.content.decode()
    assert [error["line"] for error in response.context["row_errors"]] == [3]
