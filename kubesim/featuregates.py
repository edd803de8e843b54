"""KubeVirt versions and feature gates, evaluated the way virt-config does."""

from __future__ import annotations

import re
from typing import Any

from kubesim.config import SimConfig

# Gate states at v1.9.0 for the gates the simulator's behaviour depends on (pkg/virt-config/featuregate).
GATE_STATES = {
    "ImageVolume": "Beta",
    "VSOCK": "Alpha",
    "DecentralizedLiveMigration": "Alpha",
    "LiveMigration": "GA",
    "Snapshot": "Beta",
    "ExpandDisks": "Beta",
    "HotplugVolumes": "Beta",
}


def parse_version(text: str) -> tuple[int, int, int]:
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return (0, 0, 0)
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def developer_configuration(kubevirt: dict[str, Any] | None) -> dict[str, Any]:
    return ((((kubevirt or {}).get("spec") or {}).get("configuration") or {}).get("developerConfiguration")) or {}


def gate_enabled(kubevirt: dict[str, Any] | None, gate: str) -> bool:
    """GA always on, then explicit enable, then explicit disable, then Beta on by default from v1.9."""
    state = GATE_STATES.get(gate, "Alpha")
    if state == "GA":
        return True
    developer = developer_configuration(kubevirt)
    if gate in (developer.get("featureGates") or ()):
        return True
    if gate in (developer.get("disabledFeatureGates") or ()):
        return False
    version = ((kubevirt or {}).get("status") or {}).get("observedKubeVirtVersion", "")
    return state == "Beta" and parse_version(version) >= (1, 9, 0)


ACCELERATOR = "kubesim.io/accelerator"
ACCELERATOR_REASON = "kubesim.io/accelerator-reason"


def default_kubevirt(config: SimConfig) -> dict[str, Any]:
    """The ``kubevirt/kubevirt`` CR a freshly installed operator leaves behind."""
    developer: dict[str, Any] = {}
    if config.feature_gates:
        developer["featureGates"] = list(config.feature_gates)
    if config.disabled_feature_gates:
        developer["disabledFeatureGates"] = list(config.disabled_feature_gates)
    annotations = {}
    if config.accelerator:
        # KubeVirt reports no accelerator; a cluster whose nodes lack KVM must allow emulation (useEmulation), and
        # kubesim says which one its guests run under, and why, beside it.
        annotations = {ACCELERATOR: config.accelerator, ACCELERATOR_REASON: config.accelerator_reason}
        if config.accelerator == "tcg":
            developer["useEmulation"] = True
    version = config.kubevirt_version
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {
            "name": "kubevirt",
            "namespace": "kubevirt",
            "generation": 1,
            "finalizers": ["foregroundDeleteKubeVirt"],
            **({"annotations": annotations} if annotations else {}),
        },
        "spec": {
            "certificateRotateStrategy": {},
            "configuration": {"developerConfiguration": developer},
            "customizeComponents": {},
            "imagePullPolicy": "IfNotPresent",
            "workloadUpdateStrategy": {},
        },
        "status": {
            "phase": "Deployed",
            "observedKubeVirtVersion": version,
            "targetKubeVirtVersion": version,
            "operatorVersion": version,
            "observedKubeVirtRegistry": "quay.io/kubevirt",
            "targetKubeVirtRegistry": "quay.io/kubevirt",
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": "Available",
                    "status": "True",
                    "reason": "AllComponentsReady",
                    "message": "All components are ready.",
                },
                {
                    "type": "Progressing",
                    "status": "False",
                    "reason": "AllComponentsReady",
                    "message": "All components are ready.",
                },
                {
                    "type": "Degraded",
                    "status": "False",
                    "reason": "AllComponentsReady",
                    "message": "All components are ready.",
                },
            ],
        },
    }
