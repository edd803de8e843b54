"""Timing profiles (``--profile``): delays drawn per VMI from real clusters' and guests' timings, seeded."""

from __future__ import annotations

import statistics
import time

import pytest
from kubernetes import client

from kubesim.cli import build_parser, config_from_args
from kubesim.profiles import PROFILES, profile_rng
from kubesim.testing import KubesimServer
from kubesim.tests.support import GROUP, VERSION, agent_user_data, secret_manifest, vm_manifest, wait_for

# With this seed the first VMI's drawn creation → Running is among the shortest (11.1 s), to keep the test short.
SHORT_SEED = 62


def _quantile(values: list[float], q: float) -> float:
    return sorted(values)[int(q * len(values))]


@pytest.mark.parametrize(("name", "boot_p50"), [("realistic", 55.0), ("realistic-kvm", 7.0)])
def test_a_profile_draws_kubevirt_ci_timings_and_the_guest_boot_measured_here(name, boot_p50):
    rng = profile_rng(7)
    plans = [PROFILES[name].draw(rng) for _ in range(4000)]
    to_running = [p.to_running for p in plans]
    assert 19.0 <= statistics.median(to_running) <= 21.0
    assert 28.0 <= _quantile(to_running, 0.95) <= 32.0
    assert 15.0 <= _quantile(to_running, 0.2) and _quantile(to_running, 0.99) <= 40.0
    boots = [p.agent for p in plans]
    assert boot_p50 * 0.95 <= statistics.median(boots) <= boot_p50 * 1.05
    # Most of the way to Running is the launcher's start (scheduling, image pull), as on a real cluster.
    assert all(p.scheduling > p.scheduled > p.pending > 0 for p in plans)


def test_the_same_seed_draws_the_same_delays_and_another_seed_others():
    profile = PROFILES["realistic"]
    first, again, other = profile_rng(5), profile_rng(5), profile_rng(6)
    plans = [profile.draw(first) for _ in range(5)]
    assert plans == [profile.draw(again) for _ in range(5)]
    assert plans != [profile.draw(other) for _ in range(5)]
    assert len({p.to_running for p in plans}) == 5


def _config(*flags: str):
    return config_from_args(build_parser().parse_args(["serve", "--kubeconfig", "/dev/null", *flags]))


def test_zero_delays_wins_over_a_profile_and_without_one_the_delays_are_unchanged():
    assert _config().profile == ""
    assert (_config().pending_delay, _config().scheduling_delay, _config().agent_delay) == (0.3, 1.0, 2.0)
    assert _config("--profile", "realistic").profile == "realistic"
    zero = _config("--profile", "realistic", "--zero-delays")
    assert zero.profile == ""
    assert (zero.pending_delay, zero.scheduling_delay, zero.scheduled_delay, zero.agent_delay) == (0, 0, 0, 0)
    with pytest.raises(SystemExit):
        _config("--profile", "fast")


def _running_at(custom: client.CustomObjectsApi, name: str) -> float | None:
    vmi = custom.get_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachineinstances", name)
    return time.monotonic() if (vmi.get("status") or {}).get("phase") == "Running" else None


def test_a_vmi_keeps_the_delays_drawn_for_it_and_its_lab_agent_waits_out_the_boot(tmp_path):
    expected = PROFILES["realistic-kvm"].draw(profile_rng(SHORT_SEED))
    with KubesimServer(tmp_path, guest="shell", profile="realistic-kvm", seed=SHORT_SEED) as sim:
        api = sim.api_client()
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        core.create_namespaced_secret("default", secret_manifest("p-ci", agent_user_data(token="x" * 20)))
        created = time.monotonic()
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", "virtualmachines", vm_manifest("p", cloud_init_secret="p-ci")
        )
        plan = wait_for(lambda: sim.admin.plans(), what="the drawn plan")[0]
        assert plan["name"] == "p"
        assert plan["to_running"] == pytest.approx(expected.to_running)
        assert plan["agent"] == pytest.approx(expected.agent)
        running = wait_for(lambda: _running_at(custom, "p"), timeout=expected.to_running + 10, what="Running")
        assert expected.to_running - 0.3 <= running - created <= expected.to_running + 4
        guest = sim.admin.guest("default", "p")
        assert guest is not None and not guest["agent_pid"] and "8787" not in guest["ports"]  # still booting
        wait_for(
            lambda: (g := sim.admin.guest("default", "p")) and g["ports"].get("8787"),
            timeout=expected.agent + 10,
            what="the lab agent",
        )
        assert time.monotonic() - running >= expected.agent - 0.3
        vmi = custom.get_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachineinstances", "p")
        assert any(c["type"] == "AgentConnected" for c in vmi["status"]["conditions"])
        api.close()


def test_zero_delays_wins_over_a_profile_on_a_running_server(tmp_path):
    with KubesimServer(tmp_path, guest="none", profile="realistic", zero_delays=True) as sim:
        api = sim.api_client()
        custom = client.CustomObjectsApi(api)
        created = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", "virtualmachines", vm_manifest("z"))
        running = wait_for(lambda: _running_at(custom, "z"), timeout=10, what="Running")
        assert running - created < 5
        assert sim.admin.plans() == [] and sim.admin.state()["profile"] == ""
        api.close()
