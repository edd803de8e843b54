"""The Django system check tagged ``cluster``: the preflight (``labs.kubevirt.preflight``) as check messages.

Registered as a deployment check, so a plain ``manage.py check`` (and ``migrate``, ``runserver``) never touches
the network; ``manage.py check --deploy`` runs it, and ``manage.py check --deploy --tag cluster`` runs only it.
``manage.py cluster_check`` gives the same findings with their fixes and a non-zero exit on a blocking problem.
"""

from __future__ import annotations

from django.core import checks

from labs.kubevirt import preflight

LEVELS = {preflight.ERROR: checks.Error, preflight.WARNING: checks.Warning, preflight.INFO: checks.Info}


@checks.register("cluster", deploy=True)
def cluster_preflight(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    findings = preflight.assess(preflight.gather())
    return [
        LEVELS[finding.level](finding.message, hint=finding.fix or None, id=f"labs.cluster.{finding.code}")
        for finding in findings
    ]
