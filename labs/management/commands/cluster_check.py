"""``python manage.py cluster_check``: the preflight's findings with their fixes; exit 1 when a problem blocks lab
VMs. ``--json`` prints them as JSON, ``--strict`` also fails on warnings."""

from __future__ import annotations

import json
from dataclasses import asdict

from django.core.management.base import BaseCommand, CommandError

from labs.kubevirt import cluster_facts, preflight


class Command(BaseCommand):
    help = "Check that the cluster can run the portal's lab VMs (KubeVirt, KVM nodes, feature gates)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="Print the findings as JSON.")
        parser.add_argument("--strict", action="store_true", help="Exit non-zero on warnings too.")

    def handle(self, *args, **options) -> None:
        facts = cluster_facts.gather()
        findings = preflight.assess(facts)
        version = preflight.kubevirt_version(facts.kubevirt)
        if options["json"]:
            report = {
                "server_version": facts.server_version,
                "kubevirt_version": version,
                "nodes": len(facts.nodes),
                "findings": [asdict(f) for f in findings],
            }
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self.stdout.write(
                f"Kubernetes {facts.server_version or '?'}, KubeVirt {version or '?'}, {len(facts.nodes)} node(s)."
            )
            styles = {
                preflight.ERROR: self.style.ERROR,
                preflight.WARNING: self.style.WARNING,
                preflight.INFO: self.style.NOTICE,
            }
            for finding in findings:
                self.stdout.write(styles[finding.level](f"{finding.level.upper()}: {finding.message}"))
                if finding.fix:
                    self.stdout.write(f"  Fix: {finding.fix}")
            if all(f.level == preflight.INFO for f in findings):
                self.stdout.write(self.style.SUCCESS("The cluster can run lab VMs."))
        warned = any(f.level == preflight.WARNING for f in findings)
        if preflight.blocking(findings) or (options["strict"] and warned):
            raise CommandError("The cluster cannot run lab VMs as it is; see the findings above.", returncode=1)
