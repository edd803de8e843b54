"""Admin endpoints under ``/kubesim/``: counters, faults, forced failures, nodes, KubeVirt settings, guests.

Every endpoint needs the same bearer token as the API. Documented in README.md ("Admin API").
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kubesim.bodies import json_response, optional_json_object
from kubesim.controllers.objects import KUBEVIRT, NODE
from kubesim.errors import ApiError
from kubesim.profiles import PROFILES

if TYPE_CHECKING:
    from kubesim.server import KubeSim

_DELAYS = (
    "pending_delay",
    "scheduling_delay",
    "scheduled_delay",
    "agent_delay",
    "stop_delay",
    "jitter",
    "restart_backoff",
    "image_pull_backoff",
    "bookmark_interval",
)


def register(app: web.Application, sim: KubeSim) -> None:
    async def counters(request: web.Request) -> web.Response:
        return json_response(
            sim.counters.snapshot(
                open_watches=len(sim.watches), open_consoles=len(sim.consoles), open_portforwards=len(sim.portforwards)
            )
        )

    async def reset_counters(request: web.Request) -> web.Response:
        sim.counters.reset()
        return json_response({"reset": True})

    async def get_faults(request: web.Request) -> web.Response:
        return json_response(sim.faults.describe())

    async def add_faults(request: web.Request) -> web.Response:
        sim.faults.update(await optional_json_object(request))
        return json_response(sim.faults.describe())

    async def clear_faults(request: web.Request) -> web.Response:
        sim.faults.clear()
        return json_response(sim.faults.describe())

    async def drop_watches(request: web.Request) -> web.Response:
        body = await optional_json_object(request)
        mode = body.get("mode", "reset")
        if mode not in ("reset", "close"):
            raise ApiError(400, "mode must be 'reset' or 'close'")
        return json_response({"dropped": sim.drop_watches(mode=mode, resource=body.get("resource"))})

    async def disconnect_consoles(request: web.Request) -> web.Response:
        body = await optional_json_object(request)
        dropped = 0
        for session in list(sim.consoles) + (list(sim.portforwards) if body.get("portforwards") else []):
            if body.get("namespace") and session.namespace != body["namespace"]:
                continue
            if body.get("name") and session.name != body["name"]:
                continue
            session.abort()
            dropped += 1
        return json_response({"disconnected": dropped})

    async def fail_vmi(request: web.Request) -> web.Response:
        body = await optional_json_object(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        vmi = sim.cluster.fail_vmi(
            namespace, name, reason=str(body.get("reason") or "Crashed"), message=str(body.get("message") or "")
        )
        if vmi is None:
            raise ApiError(404, f'virtualmachineinstances.kubevirt.io "{name}" not found')
        return json_response(vmi)

    async def remove_node(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not sim.cluster.remove_node(name):
            raise ApiError(404, f'nodes "{name}" not found')
        return json_response({"removed": name})

    async def add_node(request: web.Request) -> web.Response:
        body = await optional_json_object(request)
        name = body.get("name")
        if name is not None and sim.store.get("nodes", "", name) is not None:
            raise ApiError(409, f'nodes "{name}" already exists', reason="AlreadyExists")
        return json_response(sim.cluster.add_node(name), status=201)

    async def set_kubevirt(request: web.Request) -> web.Response:
        body = await optional_json_object(request)
        if "image_volume_supported" in body:
            sim.config.image_volume_supported = bool(body["image_volume_supported"])
            for node in list(sim.store.objects("nodes")):
                sim.api.mutate(
                    NODE,
                    "",
                    node["metadata"]["name"],
                    lambda o: o["status"]["nodeInfo"].__setitem__(
                        "containerRuntimeVersion", sim.config.container_runtime_version()
                    ),
                )

        def change(o: dict[str, Any]) -> None:
            developer = o["spec"].setdefault("configuration", {}).setdefault("developerConfiguration", {})
            for key, field in (("feature_gates", "featureGates"), ("disabled_feature_gates", "disabledFeatureGates")):
                if key in body:
                    if body[key]:
                        developer[field] = list(body[key])
                    else:
                        developer.pop(field, None)
            if body.get("version"):
                for field in ("observedKubeVirtVersion", "targetKubeVirtVersion", "operatorVersion"):
                    o["status"][field] = body["version"]

        enabled = set(body.get("feature_gates") or ())
        both = enabled & set(body.get("disabled_feature_gates") or ())
        if both:
            raise ApiError(
                422,
                f'feature gate "{sorted(both)[0]}" exists on both "FeatureGates" and "DisabledFeatureGates"',
                reason="Invalid",
            )
        return json_response(sim.api.mutate(KUBEVIRT, "kubevirt", "kubevirt", change))

    async def guests(request: web.Request) -> web.Response:
        return json_response({"guests": [guest.describe() for guest in sim.guests.guests.values()]})

    async def plans(request: web.Request) -> web.Response:
        """The delays the timing profile drew for each VMI kubesim is running, in order of creation."""
        drawn = [
            {"namespace": r.namespace, "name": r.name, **asdict(r.plan), "to_running": r.plan.to_running}
            for r in sim.cluster.runtimes.values()
            if r.plan is not None
        ]
        return json_response({"profile": sim.config.profile, "plans": drawn})

    async def state(request: web.Request) -> web.Response:
        return json_response(sim.describe())

    async def set_config(request: web.Request) -> web.Response:
        body = await optional_json_object(request)
        for key, value in body.items():
            if key == "bad_image_pattern":
                sim.config.bad_image_pattern = str(value)
            elif key == "profile":
                if value and value not in PROFILES:
                    raise ApiError(400, f"profile must be one of {', '.join(sorted(PROFILES))} or empty")
                sim.config.profile = str(value or "")  # VMIs created from now on
            elif key in _DELAYS:
                try:
                    setattr(sim.config, key, float(value))
                except (TypeError, ValueError) as exc:
                    raise ApiError(400, f"{key} must be a number") from exc
            else:
                raise ApiError(400, f"unknown setting {key!r}")
        return json_response({key: getattr(sim.config, key) for key in _DELAYS + ("bad_image_pattern", "profile")})

    router = app.router
    router.add_get("/kubesim/counters", counters)
    router.add_post("/kubesim/counters/reset", reset_counters)
    router.add_get("/kubesim/faults", get_faults)
    router.add_post("/kubesim/faults", add_faults)
    router.add_delete("/kubesim/faults", clear_faults)
    router.add_post("/kubesim/watches/drop", drop_watches)
    router.add_post("/kubesim/consoles/disconnect", disconnect_consoles)
    router.add_post("/kubesim/vmis/{namespace}/{name}/fail", fail_vmi)
    router.add_delete("/kubesim/nodes/{name}", remove_node)
    router.add_post("/kubesim/nodes", add_node)
    router.add_post("/kubesim/kubevirt", set_kubevirt)
    router.add_get("/kubesim/guests", guests)
    router.add_get("/kubesim/state", state)
    router.add_get("/kubesim/plans", plans)
    router.add_post("/kubesim/config", set_config)
