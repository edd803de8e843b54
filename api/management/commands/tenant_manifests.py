"""Print a tenant's namespace manifests (deploy/tenant-namespace.yaml filled in, quotas as the portal computes them)
for a cluster admin to apply, since the portal holds no RBAC rights of its own:
``python manage.py tenant_manifests "Tenant A University" | kubectl apply -f -``."""

from __future__ import annotations

from pathlib import Path
from string import Template

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q

from labs.kubevirt.manifests import quota_hard
from portal.models import Tenant

TEMPLATE = Path(settings.BASE_DIR) / "deploy" / "tenant-namespace.yaml"


class Command(BaseCommand):
    help = "Print a tenant's namespace manifests (Namespace, Role, RoleBinding, policies, quota) as YAML."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="The tenant's name (any case), namespace or numeric id.")

    def handle(self, *args, tenant: str, **options) -> None:
        found = Tenant.objects.filter(pk=int(tenant)).first() if tenant.isdigit() else None
        found = found or Tenant.objects.filter(Q(name__iexact=tenant) | Q(namespace=tenant)).first()
        if found is None:
            known = ", ".join(f'{pk} "{name}"' for pk, name in Tenant.objects.order_by("pk").values_list("pk", "name"))
            raise CommandError(f"No tenant named or numbered {tenant!r}. Tenants: {known or 'none yet'}.")
        hard = quota_hard(
            max_vms=found.max_concurrent_vms, max_vcpus=found.max_vcpus, max_memory_mib=found.max_memory_mib
        )
        values = {
            "TENANT_NAMESPACE": found.namespace,
            "TENANT_ID": str(found.pk),
            "QUOTA_VMS": hard["count/virtualmachines.kubevirt.io"],
            "QUOTA_REQUESTS_CPU": hard["requests.cpu"],
            "QUOTA_REQUESTS_MEMORY": hard["requests.memory"],
            "PORTAL_NAMESPACE": settings.PORTAL_NAMESPACE or "lab-portal",
            "KUBEVIRT_NAMESPACE": settings.KUBEVIRT_NAMESPACE,
        }
        try:
            self.stdout.write(Template(TEMPLATE.read_text()).substitute(values), ending="")
        except KeyError as exc:
            raise CommandError(f"{TEMPLATE} uses a variable this command does not know: {exc}") from None
        except ValueError as exc:  # a "$" that starts no ${NAME}: write "$$" for a literal one
            raise CommandError(f"{TEMPLATE} has a stray '$' (write '$$' for a literal one): {exc}") from None
