"""Reading VMIs and VMs into phases, timestamps and plain-words reasons."""

from datetime import UTC, datetime

from labs.kubevirt import status


def vmi(phase, *, conditions=(), reason=None, node="node-1", phases=("Pending", "Scheduling", "Scheduled", "Running")):
    body = {
        "metadata": {"name": "attempt-1"},
        "status": {
            "phase": phase,
            "nodeName": node,
            "conditions": list(conditions),
            "phaseTransitionTimestamps": [
                {"phase": p, "phaseTransitionTimestamp": f"2026-11-30T10:00:0{i}Z"} for i, p in enumerate(phases)
            ],
        },
    }
    if reason:
        body["status"]["reason"] = reason
    return body


def test_running_vmi_gives_every_phase_time_and_the_node():
    observation = status.observe_vmi(vmi("Running"))
    assert observation.running and not observation.failed and observation.problem == ""
    assert observation.node_name == "node-1"
    assert observation.phase_times == {
        "Pending": datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC),
        "Scheduling": datetime(2026, 11, 30, 10, 0, 1, tzinfo=UTC),
        "Scheduled": datetime(2026, 11, 30, 10, 0, 2, tzinfo=UTC),
        "Running": datetime(2026, 11, 30, 10, 0, 3, tzinfo=UTC),
    }


def test_unschedulable_quotes_the_scheduler():
    observation = status.observe_vmi(
        vmi(
            "Scheduling",
            phases=("Pending", "Scheduling"),
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient memory.",
                    "lastTransitionTime": "2026-11-30T10:00:05Z",
                }
            ],
        )
    )
    assert observation.problem_code == status.Problem.UNSCHEDULABLE
    assert "No node in the cluster has room" in observation.problem
    assert "3 Insufficient memory" in observation.problem
    assert observation.problem_since == datetime(2026, 11, 30, 10, 0, 5, tzinfo=UTC)


def test_image_pull_failure_names_the_image_problem():
    observation = status.observe_vmi(
        vmi(
            "Scheduling",
            phases=("Pending", "Scheduling"),
            conditions=[
                {
                    "type": "Synchronized",
                    "status": "False",
                    "reason": "ErrImagePull",
                    "message": 'failed to pull image "quay.io/missing:1": not found',
                }
            ],
        )
    )
    assert observation.problem_code == status.Problem.IMAGE_PULL
    assert "could not be downloaded" in observation.problem and "quay.io/missing:1" in observation.problem


def test_failed_vmi_reason_and_message():
    observation = status.observe_vmi(
        vmi(
            "Failed",
            reason="NodeUnresponsive",
            conditions=[
                {
                    "type": "Synchronized",
                    "status": "False",
                    "reason": "NodeUnresponsive",
                    "message": "virt-handler on node node-1 is not responsive",
                }
            ],
        )
    )
    assert observation.failed
    assert observation.problem == ("The VM failed (NodeUnresponsive: virt-handler on node node-1 is not responsive).")


def test_image_volume_failure_explains_the_fix():
    message = (
        'exec: "/container-disk-binary/usr/bin/container-disk": stat '
        "/container-disk-binary/usr/bin/container-disk: no such file or directory: unknown"
    )
    observation = status.observe_vmi(
        vmi(
            "Failed",
            reason="PodFailed",
            conditions=[{"type": "Synchronized", "status": "False", "reason": "PodFailed", "message": message}],
        )
    )
    assert observation.problem_code == status.Problem.IMAGE_VOLUME
    assert "disabledFeatureGates" in observation.problem


def test_vm_printable_status_and_events_in_words():
    assert status.vm_problem({"status": {"printableStatus": "ErrorUnschedulable"}}) == (
        "No node in the cluster has room for this VM. (ErrorUnschedulable)"
    )
    assert status.vm_problem({"status": {"printableStatus": "Running"}}) == ""
    assert status.vm_problem(None) == ""
    events = [
        {"type": "Normal", "reason": "SuccessfulCreate", "message": "Created pod", "lastTimestamp": "1"},
        {"type": "Warning", "reason": "FailedScheduling", "message": "0/3 nodes", "lastTimestamp": "2"},
    ]
    assert status.events_problem(events) == "FailedScheduling: 0/3 nodes"


def test_a_launcher_pod_not_created_ends_at_once_only_when_no_retry_can_mend_it():
    from labs.kubevirt import status

    def vmi(reason, message):
        return {
            "metadata": {"uid": "u"},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "Synchronized",
                        "status": "False",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": "2026-12-04T05:00:00Z",
                    }
                ],
            },
        }

    psa = status.observe_vmi(
        vmi(
            "FailedCreate",
            "failed to create pod for vmi a/b, it needs a privileged namespace "
            'to run: pods "x" is forbidden: violates PodSecurity "restricted"',
        )
    )
    assert psa.problem_final and psa.problem_code == status.Problem.POD_REFUSED
    quota = status.observe_vmi(vmi("FailedCreate", "failed to create virtual machine pod: exceeded quota: q"))
    assert not quota.problem_final and quota.problem_code == status.Problem.POD_WAITING
    passing = status.observe_vmi(vmi("FailedCreate", "failed to create virtual machine pod: etcdserver: timeout"))
    assert not passing.problem_final and "etcdserver" in passing.problem
    assert status.observe_vmi(vmi("FailedPvcNotFound", "PVC x not found")).problem_final
