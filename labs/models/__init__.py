"""Lab templates, their checks, attempts (one KubeVirt VM each) with their lifecycle state, tenant namespaces and
warm pools."""

from labs.models.attempts import ACTIVE_STATES, FINAL_STATES, Attempt, AttemptState, TenantNamespace
from labs.models.labs import IDLE_STOP_MIN_MINUTES, Check, GradePolicy, Lab, StdoutMatch, extra_cloud_init_problem

# Last: the pool models import Lab and Attempt from this package.
from labs.pool_models import LabPool, PoolMode, PoolVm, PoolVmState

__all__ = [
    "ACTIVE_STATES",
    "FINAL_STATES",
    "IDLE_STOP_MIN_MINUTES",
    "Attempt",
    "AttemptState",
    "Check",
    "GradePolicy",
    "Lab",
    "LabPool",
    "PoolMode",
    "PoolVm",
    "PoolVmState",
    "StdoutMatch",
    "TenantNamespace",
    "extra_cloud_init_problem",
]
