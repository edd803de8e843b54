"""``manage.py seed_demo``: create the demo tenant, course, lab and people (idempotent) and print the logins."""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError

from ops.demo import demo_seed
from portal.errors import ApplicationError


class Command(BaseCommand):
    help = (
        'Create the demo tenant "Demo University", a course, the lab "Linux basics" with three checks, an '
        "instructor, a TA, three students and a superuser, then print the URL and their logins (the superuser's "
        "random password only when it is made). Re-running changes "
        "nothing. DEMO_PASSWORD sets one password for all demo accounts (required in production)."
    )

    def add_arguments(self, parser) -> None:
        port = os.environ.get("PORTAL_PORT", "8000")
        parser.add_argument(
            "--url",
            default=f"http://127.0.0.1:{port}/",
            help="Where the portal is served, for the printed hint (default %(default)s).",
        )

    def handle(self, *args, url: str, **options) -> None:
        try:
            seed = demo_seed()
        except ApplicationError as exc:
            raise CommandError(exc.message) from exc
        url = url if url.endswith("/") else f"{url}/"
        if seed.created:
            self.stdout.write(self.style.SUCCESS("Demo data created: " + ", ".join(seed.created) + "."))
        else:
            self.stdout.write("Demo data already present; nothing changed.")
        self.stdout.write(f"Portal: {url}    Admin (instructor): {url}admin/")
        self.stdout.write(
            f'Course {seed.course.code} "{seed.course.title}", lab "{seed.lab.title}" in {seed.tenant.name}.'
        )
        if seed.superuser_password:
            self.stdout.write(
                f"Superuser (tenants, quotas, the ops dashboard at {url}admin/ops/), shown this once: "
                f"{seed.superuser} / {seed.superuser_password}"
            )
        else:
            self.stdout.write(
                f"Superuser: {seed.superuser} (its password was shown when it was made; "
                f"`python manage.py changepassword {seed.superuser}` sets a new one)."
            )
        self.stdout.write("Logins (username / password):")
        width = max(len(login.username) for login in seed.logins)
        for login in seed.logins:
            line = f"  {login.username:<{width}}  {login.password:<20}  {login.role:<10}  {login.full_name}"
            if login.admin:
                line += f"  (also {url}admin/)"
            if not login.password_works:
                line += "  (password changed since seeding: this one no longer works)"
            self.stdout.write(line)
