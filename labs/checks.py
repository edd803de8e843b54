"""The deploy-tagged system check ``cluster``: the preflight as check messages, run by ``manage.py check --deploy``
(never by a plain ``check``, ``migrate`` or ``runserver``)."""

from __future__ import annotations

from django.core import checks

from labs.kubevirt import cluster_facts, preflight

LEVELS = {preflight.ERROR: checks.Error, preflight.WARNING: checks.Warning, preflight.INFO: checks.Info}


@checks.register("cluster", deploy=True)
def cluster_preflight(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    findings = preflight.assess(cluster_facts.gather())
    return [
        LEVELS[finding.level](finding.message, hint=finding.fix or None, id=f"labs.cluster.{finding.code}")
        for finding in findings
    ]
