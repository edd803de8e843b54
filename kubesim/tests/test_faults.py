"""Each injectable fault, observed by a client; and the request counters benchmarks rely on."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kubesim.tests.support import GROUP, VERSION, vm_manifest, wait_for


@pytest.fixture(autouse=True)
def no_faults_left(sim):
    yield
    sim.admin.clear_faults()


def test_latency_per_verb(sim, custom, core, namespace):
    # The list's latency is wide enough that a create delayed by it stands out from a create slowed by a busy host.
    sim.admin.inject_fault(latency={"list": 4.0, "get:secrets": 0.5})
    started = time.monotonic()
    custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachines")
    assert time.monotonic() - started >= 4.0
    started = time.monotonic()
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", vm_manifest("fast", namespace=namespace, run_strategy="Halted")
    )
    assert time.monotonic() - started < 2.0, "other verbs are not delayed"
    started = time.monotonic()
    with pytest.raises(ApiException):
        core.read_namespaced_secret("absent", namespace)
    assert time.monotonic() - started >= 0.5, "verb:resource latency"


@pytest.mark.parametrize("code", [500, 503])
def test_error_rate_per_verb_and_resource(sim, custom, core, namespace, code):
    sim.admin.inject_fault(code=code, verbs=["list"], resources=["virtualmachineinstances"], count=2)
    for _ in range(2):
        with pytest.raises(ApiException) as error:
            custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachineinstances")
        assert error.value.status == code
        assert json.loads(error.value.body)["code"] == code
    core.list_namespaced_pod(namespace)  # other resources are unaffected
    assert custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachineinstances")["items"] == []


def test_an_error_rule_with_namespaces_answers_only_there(sim, custom, namespace):
    sim.admin.inject_fault(code=500, verbs=["list"], namespaces=[namespace])
    with pytest.raises(ApiException) as error:
        custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachineinstances")
    assert error.value.status == 500
    assert custom.list_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachineinstances")["items"] == []
    assert sim.admin.faults()["errors"][0]["namespaces"] == [namespace]


def test_429_carries_retry_after(sim, namespace):
    sim.admin.inject_fault(code=429, verbs=["create"], resources=["virtualmachines"], retry_after=7)
    http = urllib3.PoolManager()
    response = http.request(
        "POST",
        f"{sim.url}/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines",
        body=json.dumps(vm_manifest("x", namespace=namespace)),
        headers={**sim.auth_header(), "Content-Type": "application/json"},
    )
    assert response.status == 429 and response.headers["Retry-After"] == "7"
    body = json.loads(response.data)
    assert (body["reason"], body["details"]["retryAfterSeconds"]) == ("TooManyRequests", 7)


def test_partial_error_rate(sim, custom, namespace):
    sim.admin.inject_fault(code=500, rate=0.5, verbs=["get"], resources=["namespaces"])
    outcomes = []
    core = client.CoreV1Api(custom.api_client)
    for _ in range(60):
        try:
            core.read_namespace(namespace)
            outcomes.append(True)
        except ApiException as exc:
            assert exc.status == 500
            outcomes.append(False)
    assert 10 < outcomes.count(False) < 50


def test_dropped_watch_streams(sim, custom, namespace):
    rv = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachines")["metadata"][
        "resourceVersion"
    ]
    response = custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", watch=True, resource_version=rv, _preload_content=False
    )
    wait_for(lambda: sim.admin.counters()["open_watches"] >= 1, what="watch open")
    assert sim.admin.drop_watches() >= 1
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for _ in response.stream(amt=None, decode_content=False):
            pass
    # watch_drop_after: every new watch dies mid-stream after that long.
    sim.admin.inject_fault(watch_drop_after=0.3)
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for _ in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "virtualmachines",
            resource_version=rv,
            timeout_seconds=10,
        ):
            pass
    assert time.monotonic() - started < 5


async def test_console_disconnects(sim, custom, namespace):
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", vm_manifest("cut", namespace=namespace)
    )
    wait_for(
        lambda: (
            custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachineinstances", "cut")
            .get("status", {})
            .get("phase")
            == "Running"
        ),
        what="Running",
    )
    url = f"{sim.ws_url}/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/cut/console"
    async with aiohttp.ClientSession(headers=sim.auth_header()) as session:
        ws = await session.ws_connect(url, protocols=("plain.kubevirt.io",))
        assert await asyncio.to_thread(sim.admin.disconnect_consoles, namespace=namespace, name="cut") == 1
        async with asyncio.timeout(5):
            while (await ws.receive()).type not in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                pass
        assert ws.close_code == 1006
        await asyncio.to_thread(sim.admin.inject_fault, console_drop_after=0.3)
        ws = await session.ws_connect(url, protocols=("plain.kubevirt.io",))
        started = time.monotonic()
        async with asyncio.timeout(5):
            while (await ws.receive()).type not in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                pass
        assert ws.close_code == 1006 and time.monotonic() - started >= 0.25


def test_counters_by_verb_and_resource(sim, custom, core, namespace):
    sim.admin.reset_counters()
    custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachineinstances")
    custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "virtualmachineinstances")
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "virtualmachines", vm_manifest("count", namespace=namespace, run_strategy="Halted")
    )
    list(
        watch.Watch().stream(
            custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "virtualmachines", timeout_seconds=1
        )
    )
    counters = sim.admin.counters()
    assert counters["by_verb_resource"] == {
        "list virtualmachineinstances": 2,
        "create virtualmachines": 1,
        "watch virtualmachines": 1,
    }
    assert counters["total"] == 4 and counters["by_verb"]["list"] == 2
    assert counters["by_resource"]["virtualmachineinstances"] == 2
    assert counters["watch_events_sent"] >= 1 and counters["elapsed_seconds"] > 0
    sim.admin.reset_counters()
    assert sim.admin.counters()["total"] == 0


def test_bad_fault_specifications_are_refused(sim):
    from kubesim.testing import KubesimError

    with pytest.raises(KubesimError, match="400"):
        sim.admin.inject_fault(code=418)
    with pytest.raises(KubesimError, match="400"):
        sim.admin.inject_fault(code=500, rate=2)
    assert sim.admin.faults()["errors"] == []


def test_fault_flags_apply_from_the_start(tmp_path):
    from kubesim.testing import KubesimServer

    with KubesimServer(
        tmp_path, guest="none", extra_args=["--error=500:1:list:virtualmachines", "--latency=get:namespaces=0.3"]
    ) as faulty:
        api = faulty.api_client()
        started = time.monotonic()
        client.CoreV1Api(api).read_namespace("default")
        assert time.monotonic() - started >= 0.3
        with pytest.raises(ApiException) as error:
            client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachines")
        assert error.value.status == 500
        assert faulty.admin.faults()["errors"][0]["verbs"] == ["list"]
        api.close()
