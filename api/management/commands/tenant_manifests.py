"""Print a tenant's namespace manifests (deploy/tenant-namespace.yaml filled in, quotas as the portal computes them)
for a cluster admin to apply, since the portal holds no RBAC rights of its own:
``python manage.py tenant_manifests "Tenant A University" | kubectl apply -f -``."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from labs.kubevirt.manifests import quota_hard
from portal.models import Tenant

TEMPLATE = Path(settings.BASE_DIR) / "deploy" / "tenant-namespace.yaml"
PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")


def tenant_values(tenant: Tenant) -> dict[str, str]:
    hard = quota_hard(
        max_vms=tenant.max_concurrent_vms, max_vcpus=tenant.max_vcpus, max_memory_mib=tenant.max_memory_mib
    )
    return {
        "TENANT_NAMESPACE": tenant.namespace,
        "TENANT_ID": str(tenant.pk),
        "QUOTA_VMS": hard["count/virtualmachines.kubevirt.io"],
        "QUOTA_REQUESTS_CPU": hard["requests.cpu"],
        "QUOTA_REQUESTS_MEMORY": hard["requests.memory"],
        "PORTAL_NAMESPACE": settings.PORTAL_NAMESPACE or "lab-portal",
        "KUBEVIRT_NAMESPACE": settings.KUBEVIRT_NAMESPACE,
    }


def render_tenant_manifests(tenant: Tenant) -> str:
    values = tenant_values(tenant)
    text = TEMPLATE.read_text()
    unknown = sorted(set(PLACEHOLDER.findall(text)) - set(values))
    if unknown:
        raise CommandError(f"{TEMPLATE} uses variables this command does not know: {', '.join(unknown)}")
    return PLACEHOLDER.sub(lambda match: values[match.group(1)], text)


class Command(BaseCommand):
    help = "Print a tenant's namespace manifests (Namespace, Role, RoleBinding, policies, quota) as YAML."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="The tenant's name or numeric id.")

    def handle(self, *args, tenant: str, **options) -> None:
        found = Tenant.objects.filter(pk=int(tenant)).first() if tenant.isdigit() else None
        found = found or Tenant.objects.filter(name=tenant).first()
        if found is None:
            raise CommandError(f"No tenant named or numbered {tenant!r}.")
        self.stdout.write(render_tenant_manifests(found), ending="")
