"""The warm pools' families on ``/metrics`` (one series per lab with a pool), read from the database at scrape."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from labs.pool_selectors import pool_stats


def pool_families(now: datetime) -> Iterator[Metric]:
    labels = ["tenant", "lab"]
    vms = GaugeMetricFamily(
        "portal_pool_vms",
        "Warm pool VMs by lab and state (claimed: their attempt is active).",
        labels=[*labels, "state"],
    )
    target = GaugeMetricFamily("portal_pool_target", "How many unclaimed VMs the pool should hold now.", labels=labels)
    hits = CounterMetricFamily("portal_pool_hits", "Starts that claimed a ready pool VM.", labels=labels)
    misses = CounterMetricFamily(
        "portal_pool_misses", "Starts that found no ready pool VM while the pool was warm.", labels=labels
    )
    idle = CounterMetricFamily(
        "portal_pool_idle_vm_seconds", "VM-seconds pool VMs spent up and unclaimed.", labels=labels
    )
    ratio = GaugeMetricFamily(
        "portal_pool_hit_ratio", "Hits over hits and misses (no series before a start).", labels=labels
    )
    for stats in pool_stats(now=now):
        key = [stats.namespace, str(stats.lab_id)]
        for state, count in (("ready", stats.ready), ("booting", stats.booting), ("claimed", stats.claimed)):
            vms.add_metric([*key, state], count)
        target.add_metric(key, stats.target)
        hits.add_metric(key, stats.hits)
        misses.add_metric(key, stats.misses)
        idle.add_metric(key, stats.idle_vm_seconds)
        if stats.hit_ratio is not None:
            ratio.add_metric(key, stats.hit_ratio)
    yield from (vms, target, hits, misses, idle, ratio)
