"""Timing profiles: phase delays drawn per VMI from what real clusters and guests take (``--profile``).

``realistic``: VM creation → VMI Running as in KubeVirt's performance CI (p50 ≈ 20 s, p95 ≈ 30 s), and a shell or
none guest's agent ready as long after Running as a real guest took to boot under TCG here (p50 ≈ 55 s).
``realistic-kvm``: the same cluster, with a guest boot of several seconds as under KVM. Sources in README.md.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

Z95 = 1.6448536269514722  # the standard normal's 95th percentile


@dataclass(frozen=True)
class Lognormal:
    """A lognormal distribution given by its median and 95th percentile, in seconds."""

    p50: float
    p95: float

    def draw(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.p50), math.log(self.p95 / self.p50) / Z95)


@dataclass(frozen=True)
class PhasePlan:
    """One VMI's delays: seconds in Pending, Scheduling and Scheduled, then Running → agent ready."""

    pending: float
    scheduling: float
    scheduled: float
    agent: float

    @property
    def to_running(self) -> float:
        return self.pending + self.scheduling + self.scheduled


@dataclass(frozen=True)
class Profile:
    """Creation → Running drawn as one figure and split over the phases; the guest's boot drawn apart."""

    name: str
    to_running: Lognormal
    guest_boot: Lognormal
    # Pending (virt-controller renders the pod), Scheduling (scheduling, image pull, launcher start), Scheduled
    # (virt-handler defines and starts the domain). The split is ours; the CI reports only the total.
    shares: tuple[float, float, float] = (0.1, 0.7, 0.2)

    def draw(self, rng: random.Random) -> PhasePlan:
        total = self.to_running.draw(rng)
        pending, scheduling, scheduled = (total * share for share in self.shares)
        return PhasePlan(pending, scheduling, scheduled, self.guest_boot.draw(rng))


CLUSTER = Lognormal(p50=20.0, p95=30.0)
PROFILES = {
    "realistic": Profile("realistic", CLUSTER, guest_boot=Lognormal(p50=55.0, p95=70.0)),
    "realistic-kvm": Profile("realistic-kvm", CLUSTER, guest_boot=Lognormal(p50=7.0, p95=10.0)),
}


def profile_rng(seed: int | None) -> random.Random:
    """The profile's own random stream: with ``--seed`` the n-th VMI gets the same delays in every run, whatever
    else (names, addresses) drew from the cluster's stream."""
    return random.Random(None if seed is None else f"profile:{seed}")
