"""Pure pieces of kubesim: quantities, selectors, patches, launcher arithmetic, admission, cloud-init decoding."""

from __future__ import annotations

import base64
import gzip
from decimal import Decimal

import aiohttp
import pytest

from kubesim import admission
from kubesim.cloudinit import CloudInitError, apply_write_files, decode_content, unapplied
from kubesim.errors import ApiError
from kubesim.featuregates import gate_enabled
from kubesim.launcher import launcher_requests
from kubesim.patch import json_patch, merge_patch
from kubesim.quantity import QuantityError, format_cpu, format_memory, parse_quantity
from kubesim.selectors import FieldSelector, LabelSelector, SelectorError
from kubesim.tests.support import vm_manifest


def test_quantities_parse_and_format_like_the_api_server():
    assert parse_quantity("200m") == Decimal("0.2")
    assert parse_quantity("4Gi") == 4 * 2**30
    assert parse_quantity("1.5Gi") == 1536 * 2**20
    assert parse_quantity("1e3") == 1000
    assert format_cpu(Decimal("0.2")) == "200m"
    assert format_cpu(Decimal(2)) == "2"
    assert format_memory(Decimal(4372 * 2**20)) == "4372Mi"
    with pytest.raises(QuantityError):
        parse_quantity("lots")


def test_remembered_quantities_stay_exact_and_anything_odd_is_still_a_quantity_error():
    # Parsed once and remembered: the same answers the second time, 1 and 1.0 and True kept apart.
    for _ in range(2):
        assert parse_quantity("2392Mi") == 2392 * 2**20
        assert parse_quantity(1) == 1 and parse_quantity(1.5) == Decimal("1.5")
        with pytest.raises(QuantityError):
            parse_quantity("lots")  # a refusal is not remembered as an answer
        with pytest.raises(QuantityError):
            parse_quantity(True)
    # What a manifest may carry that is no quantity at all (a list, a mapping) is refused the same way, not with
    # the TypeError that remembering an unhashable value would raise.
    for odd in (["1Gi"], {"memory": "1Gi"}, None):
        with pytest.raises(QuantityError):
            parse_quantity(odd)


def test_launcher_requests_follow_v1_9_and_stay_near_the_measured_cluster():
    spec = {"domain": {"cpu": {"cores": 2}, "resources": {"requests": {"memory": "4Gi"}}}}
    cpu, memory = launcher_requests(spec, developer={}, fixed_overhead="220Mi")
    assert format_cpu(cpu) == "200m"
    # v1.9.0: 4Gi + 8Mi and a byte of page tables (kB-rounded) + 220Mi + 16Mi + 8Mi + 32Mi.
    assert memory == 4380 * 2**20 + 1
    # Measured on a real cluster: 200m and 4372Mi; v1.9.0's figure is within 0.2 % of it.
    assert abs(memory - 4372 * 2**20) / (4372 * 2**20) < Decimal("0.002")
    # An explicit CPU request wins over vCPUs / cpuAllocationRatio; the ratio comes from the KubeVirt CR.
    explicit = {"domain": {"resources": {"requests": {"memory": "1Gi", "cpu": "1"}}}}
    assert format_cpu(launcher_requests(explicit, developer={}, fixed_overhead="212Mi")[0]) == "1"
    ratio = {"domain": {"cpu": {"cores": 4}, "resources": {"requests": {"memory": "1Gi"}}}}
    assert format_cpu(launcher_requests(ratio, developer={"cpuAllocationRatio": 4}, fixed_overhead="0")[0]) == "1"


def test_label_selectors():
    selector = LabelSelector.parse("app=web,tier in (a, b),!legacy,env!=prod")
    assert selector.matches({"app": "web", "tier": "a", "env": "dev"})
    assert not selector.matches({"app": "web", "tier": "c"})
    assert not selector.matches({"app": "web", "tier": "a", "legacy": "1"})
    assert not selector.matches({"app": "web", "tier": "b", "env": "prod"})
    with pytest.raises(SelectorError):
        LabelSelector.parse("a in b c")


def test_field_selectors_reject_unsupported_fields():
    fields = FieldSelector.parse(
        "metadata.name=x,status.phase!=Failed", supported=frozenset({"metadata.name", "status.phase"})
    )
    assert fields.matches({"metadata": {"name": "x"}, "status": {"phase": "Running"}})
    assert not fields.matches({"metadata": {"name": "x"}, "status": {"phase": "Failed"}})
    assert fields.exact_name() == "x"
    with pytest.raises(SelectorError, match="field label not supported"):
        FieldSelector.parse("spec.foo=1", supported=frozenset({"metadata.name"}))


def test_merge_and_json_patch():
    doc = {"spec": {"runStrategy": "Always", "list": [1, 2]}, "metadata": {"labels": {"a": "1"}}}
    merged = merge_patch(doc, {"spec": {"runStrategy": "Halted", "list": [3]}, "metadata": {"labels": {"a": None}}})
    assert merged == {"spec": {"runStrategy": "Halted", "list": [3]}, "metadata": {"labels": {}}}
    patched = json_patch(
        doc,
        [
            {"op": "test", "path": "/spec/runStrategy", "value": "Always"},
            {"op": "replace", "path": "/spec/runStrategy", "value": "Halted"},
            {"op": "add", "path": "/spec/list/-", "value": 3},
            {"op": "remove", "path": "/metadata/labels/a"},
        ],
    )
    assert patched["spec"] == {"runStrategy": "Halted", "list": [1, 2, 3]} and patched["metadata"]["labels"] == {}
    assert doc["spec"]["runStrategy"] == "Always", "patches work on a copy"
    with pytest.raises(ApiError) as failed:
        json_patch(doc, [{"op": "test", "path": "/spec/runStrategy", "value": "Manual"}])
    assert failed.value.code == 422


def test_admission_rejects_what_kubevirt_rejects():
    both = vm_manifest("a", run_strategy="Always", running=True)
    with pytest.raises(ApiError) as error:
        admission.admit_virtual_machine(both)
    assert error.value.code == 422 and admission.MUTUALLY_EXCLUSIVE in error.value.message
    neither = vm_manifest("a", run_strategy=None)
    with pytest.raises(ApiError, match="RunStrategy must be specified"):
        admission.admit_virtual_machine(neither)
    with pytest.raises(ApiError, match=r"Invalid RunStrategy \(Sometimes\)"):
        admission.admit_virtual_machine(vm_manifest("a", run_strategy="Sometimes"))
    assert admission.admit_virtual_machine(vm_manifest("a", run_strategy=None, running=True)) == [
        "spec.running is deprecated, please use spec.runStrategy instead"
    ]
    unknown = vm_manifest("a")
    unknown["spec"]["template"]["spec"]["domain"]["devcies"] = {}
    unknown["spec"]["template"]["spec"]["domain"]["devices"]["disks"][0]["bootOrdr"] = 1
    for default in (None, "", "Warn"):  # the API server's default since v1.23: pruned, one warning per field
        pruned, warnings = admission.validate_schema(unknown, field_validation=default)
        assert warnings == [
            'unknown field "spec.template.spec.domain.devcies"',
            'unknown field "spec.template.spec.domain.devices.disks[0].bootOrdr"',
        ]
        assert "devcies" not in pruned["spec"]["template"]["spec"]["domain"]
        assert "bootOrdr" not in pruned["spec"]["template"]["spec"]["domain"]["devices"]["disks"][0]
    assert "devcies" in unknown["spec"]["template"]["spec"]["domain"], "the request's own object is left as sent"
    pruned, warnings = admission.validate_schema(unknown, field_validation="Ignore")
    assert warnings == [] and "devcies" not in pruned["spec"]["template"]["spec"]["domain"]
    with pytest.raises(ApiError) as error:
        admission.validate_schema(unknown, field_validation="Strict")
    assert error.value.code == 400 and error.value.message == (
        'strict decoding error: unknown field "spec.template.spec.domain.devcies", '
        'unknown field "spec.template.spec.domain.devices.disks[0].bootOrdr"'
    )
    with pytest.raises(ApiError) as error:
        admission.validate_schema(vm_manifest("a"), field_validation="strict")
    assert error.value.code == 400 and 'Unsupported value: "strict"' in error.value.message
    wrong_type = vm_manifest("a")
    wrong_type["spec"]["template"]["spec"]["domain"]["devices"]["disks"][0]["bootOrder"] = "first"
    with pytest.raises(ApiError, match="must be of type integer") as error:
        admission.validate_schema(wrong_type, field_validation=None)
    assert error.value.code == 422
    assert admission.validate_schema(vm_manifest("a"), field_validation="Strict") == (vm_manifest("a"), [])


def test_feature_gate_evaluation_order():
    def kubevirt(version, enabled=(), disabled=()):
        return {
            "spec": {
                "configuration": {
                    "developerConfiguration": {"featureGates": list(enabled), "disabledFeatureGates": list(disabled)}
                }
            },
            "status": {"observedKubeVirtVersion": version},
        }

    assert gate_enabled(kubevirt("v1.9.0"), "ImageVolume"), "Beta gates are on by default from v1.9"
    assert not gate_enabled(kubevirt("v1.8.2"), "ImageVolume")
    assert gate_enabled(kubevirt("v1.8.2", enabled=["ImageVolume"]), "ImageVolume")
    assert not gate_enabled(kubevirt("v1.9.0", disabled=["ImageVolume"]), "ImageVolume")


def test_write_files_encodings_permissions_and_confinement(tmp_path):
    payload = b"#!/bin/sh\necho hi\n"
    assert decode_content(base64.b64encode(payload).decode(), "b64") == payload
    assert decode_content(base64.b64encode(gzip.compress(payload)).decode(), "gz+b64") == payload
    assert decode_content(gzip.compress(payload), "gzip") == payload
    user_data = (
        "#cloud-config\nwrite_files:\n"
        "- path: /opt/x/run.sh\n  permissions: '0750'\n  encoding: base64\n"
        f"  content: {base64.b64encode(payload).decode()}\n"
        "- path: /home/student/notes.txt\n  content: hello\n"
    )
    written = apply_write_files(tmp_path, user_data)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == ["opt/x/run.sh", "home/student/notes.txt"]
    assert (tmp_path / "opt/x/run.sh").read_bytes() == payload
    assert (tmp_path / "opt/x/run.sh").stat().st_mode & 0o777 == 0o750
    with pytest.raises(CloudInitError, match="escapes"):
        apply_write_files(tmp_path, "#cloud-config\nwrite_files:\n- path: /../../etc/evil\n  content: x\n")


def test_a_long_list_encoding_lets_the_event_loop_serve_other_streams_meanwhile():
    import asyncio
    import time

    from kubesim.server import LIST_ENCODING_SLICE_SECONDS, encoded_items
    from kubesim.store import Entry

    class SlowEntry(Entry):
        """An object whose encoding takes a millisecond, as a changed VMI's does."""

        def json(self) -> bytes:
            time.sleep(0.001)
            return super().json()

    entries = [SlowEntry({"metadata": {"name": f"vm-{index}"}}) for index in range(40)]

    async def main() -> tuple[bytes, int]:
        ticks = 0
        done = asyncio.Event()

        async def other_stream() -> None:  # a console or watch stream on the same loop
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(other_stream())
        await asyncio.sleep(0)
        ticks = 0
        body = await encoded_items(entries)
        done.set()
        await ticker
        return body, ticks

    body, ticks = asyncio.run(main())
    assert body == b",".join(Entry(entry.obj).json() for entry in entries)
    # 40 ms of encoding in slices of a few: the other stream ran between slices, not only after the list.
    assert ticks >= int(0.040 / LIST_ENCODING_SLICE_SECONDS) // 2
    assert asyncio.run(encoded_items([])) == b""


@pytest.mark.parametrize(
    "failure, status, logged",
    [
        # The client left while the answer was being written (its socket closing, not yet gone): nobody to answer.
        (aiohttp.ClientConnectionResetError("Cannot write to closing transport"), 499, False),
        (ConnectionResetError("Connection lost"), 499, False),
        # A real failure of the server's: a Status for the client, a traceback for the operator.
        (KeyError("status"), 500, True),
    ],
    ids=["closing transport", "connection lost", "server failure"],
)
async def test_a_client_gone_mid_answer_is_not_logged_as_a_server_failure(failure, status, logged, caplog):
    from aiohttp.test_utils import make_mocked_request

    from kubesim.config import SimConfig
    from kubesim.server import KubeSim

    sim = KubeSim(config=SimConfig(), token="token")
    request = make_mocked_request(
        "GET",
        "/apis/subresources.kubevirt.io/v1/namespaces/n/virtualmachineinstances/v/console",
        headers={"Authorization": "Bearer token"},
    )

    async def handler(_request):
        raise failure

    with caplog.at_level("DEBUG", logger="kubesim.server"):
        response = await sim._middleware(request, handler)
    assert response.status == status
    errors = [record for record in caplog.records if record.levelname == "ERROR"]
    assert bool(errors) is logged


def test_what_cloud_init_asked_for_that_a_simulated_guest_does_not_do_is_named():
    portal = (
        "#cloud-config\nwrite_files: []\nusers: [{name: student}]\nruncmd:\n"
        "- systemctl daemon-reload\n- systemctl enable --now lab-agent.service\n"
        "- systemctl restart serial-getty@ttyS0.service\n"
    )
    assert unapplied(portal) == [], "the portal's own steps are simulated"
    lab = portal + (
        "- [useradd, alice]\n- echo ready > /etc/motd\npackages: [tree, git]\nbootcmd: [setenforce 0]\n"
        "timezone: Asia/Tokyo\n"
    )
    assert unapplied(lab) == [
        "runcmd: useradd alice",
        "runcmd: echo ready > /etc/motd",
        "packages: tree git",
        "bootcmd: setenforce 0",
        "timezone: (not simulated)",
    ]
    assert unapplied("#!/bin/sh\necho hi\n") == [
        "user data of another kind ('#!/bin/sh'): only #cloud-config write_files are applied"
    ]
    assert unapplied("") == [] and unapplied("#cloud-config\n: [\n") == []
    assert unapplied("#cloud-config\nusers: [default, {name: student}, {name: alice}]\nhostname: lab1\n") == [
        "users: alice",
        "hostname: (not simulated)",
    ]


def test_quota_usage_follows_every_pod_write_as_a_recount_would():
    """ResourceQuota usage is kept as pods are written (not summed over the namespace per question): after each
    create, change, final phase and delete it equals a recount of the pods there, pods written before the
    tracker began included."""
    import random

    from kubesim.controllers.quota import PodUsage, pod_requests
    from kubesim.store import Store

    store = Store()
    rng = random.Random(7)

    def pod(name: str, namespace: str, cpu: str, memory: str, phase: str = "Running") -> dict:
        container = {"name": "compute", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
        return {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [container, {"name": "guest-console-log"}]},
            "status": {"phase": phase},
        }

    def recount(namespace: str) -> tuple:
        counted = [pod_requests(entry.obj) for entry in store.entries("pods", namespace)]
        counted = [requests for requests in counted if requests is not None]
        return (
            len(counted),
            sum((cpu for cpu, _ in counted), Decimal(0)),
            sum((memory for _, memory in counted), Decimal(0)),
        )

    store.create("pods", pod("early", "a", "100m", "1Gi"))
    usage = PodUsage(store)
    names: list[tuple[str, str]] = [("a", "early")]
    for step in range(300):
        action = rng.choice(("create", "create", "change", "finish", "delete"))
        if action == "create" or not names:
            namespace = rng.choice(("a", "b"))
            name = f"p{step}"
            store.create(
                "pods", pod(name, namespace, rng.choice(("100m", "1", "250m")), rng.choice(("1286Mi", "2Gi", "512Mi")))
            )
            names.append((namespace, name))
        else:
            namespace, name = rng.choice(names)
            if action == "delete":
                store.remove("pods", namespace, name)
                names.remove((namespace, name))
            else:
                new = pod(name, namespace, "2", "4Gi", phase="Succeeded" if action == "finish" else "Running")
                new["metadata"]["uid"] = store.get("pods", namespace, name)["metadata"]["uid"]
                store.replace("pods", new)
        for namespace in ("a", "b", "empty"):
            used = usage.usage(namespace)
            assert (used["pods"], used["requests.cpu"], used["requests.memory"]) == recount(namespace), step
            assert used["count/pods"] == used["pods"] and used["cpu"] == used["requests.cpu"]
    assert usage.usage("a")["pods"] + usage.usage("b")["pods"] > 0, "the walk left some pods running"


def test_a_serving_kubesim_freezes_its_startup_objects_and_collects_young_ones_less_often():
    import subprocess
    import sys

    from kubesim.cli import SERVER_GC_THRESHOLDS

    program = (
        "import gc\nfrom kubesim.server import KubeSim\nfrom kubesim.config import SimConfig\n"
        "sim = KubeSim(config=SimConfig(), token='t')\nimport kubesim.cli\n"
        "print(gc.get_freeze_count(), *gc.get_threshold())\n"
        "kubesim.cli.settle_heap()\nprint(gc.get_freeze_count(), *gc.get_threshold())"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    before, after = ([int(n) for n in line.split()] for line in result.stdout.strip().splitlines()[-2:])
    assert before == [0, 700, 10, 10]
    assert after[0] > 10_000 and tuple(after[1:]) == SERVER_GC_THRESHOLDS


def test_protobuf_bodies_of_unknown_kinds_are_415_and_malformed_ones_400():
    from kubesim import protobuf
    from kubesim.errors import ApiError

    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    pod = protobuf.MAGIC + field(1, field(1, b"v1") + field(2, b"Pod")) + field(2, b"")
    with pytest.raises(ApiError) as refused:
        protobuf.decode(pod)
    assert refused.value.code == 415
    with pytest.raises(ApiError) as broken:
        protobuf.decode(protobuf.MAGIC + b"\x0a\x7f")
    assert broken.value.code == 400
    namespace = protobuf.MAGIC + field(1, field(1, b"v1") + field(2, b"Namespace")) + field(2, field(1, field(1, b"x")))
    assert protobuf.decode(namespace) == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}


@pytest.mark.parametrize("accelerator", ["tcg", "kvm", ""])
def test_the_accelerator_is_told_as_a_cluster_tells_it(accelerator):
    """Under TCG: the KubeVirt CR allows emulation, nodes offer no KVM, launcher pods ask for none and still
    schedule; the CR's annotations say which accelerator and why."""
    import random

    from kubesim.config import SimConfig
    from kubesim.featuregates import default_kubevirt
    from kubesim.launcher import render_pod
    from kubesim.scheduler import Scheduler, render_node

    config = SimConfig(accelerator=accelerator, accelerator_reason="because" if accelerator else "")
    kubevirt = default_kubevirt(config)
    developer = kubevirt["spec"]["configuration"]["developerConfiguration"]
    annotations = kubevirt["metadata"].get("annotations") or {}
    node = render_node(config, 1, "node01")
    vmi = {
        "metadata": {"name": "a", "namespace": "n", "uid": "u"},
        "spec": vm_manifest("a")["spec"]["template"]["spec"],
    }
    pod = render_pod(
        vmi,
        cpu=Decimal("0.1"),
        memory=Decimal(2**30),
        kubevirt_version="v1.9.0",
        rng=random.Random(1),
        kubevirt=kubevirt,
    )
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    scheduler = Scheduler()
    scheduler.add_node(node, 1)
    if accelerator == "tcg":
        assert developer.get("useEmulation") is True
        assert annotations == {"kubesim.io/accelerator": "tcg", "kubesim.io/accelerator-reason": "because"}
        assert node["status"]["allocatable"]["devices.kubevirt.io/kvm"] == "0"
        assert "devices.kubevirt.io/kvm" not in limits and "devices.kubevirt.io/vhost-net" not in limits
        assert scheduler.pick(Decimal("0.1"), Decimal(2**30), kvm=0)[0] == "node01"
        assert "Insufficient devices.kubevirt.io/kvm" in scheduler.pick(Decimal("0.1"), Decimal(2**30), kvm=1)[1]
    else:
        assert "useEmulation" not in developer
        assert annotations == (
            {"kubesim.io/accelerator": "kvm", "kubesim.io/accelerator-reason": "because"} if accelerator else {}
        )
        assert node["status"]["allocatable"]["devices.kubevirt.io/kvm"] == "1k"
        assert limits["devices.kubevirt.io/kvm"] == "1"
        assert scheduler.pick(Decimal("0.1"), Decimal(2**30), kvm=1)[0] == "node01"
