"""The HTTP and WebSocket front of kubesim: routing, authentication, REST verbs, list/watch, discovery and
the admin endpoints. Streaming subresources live in ``streams.py``.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import yaml
from aiohttp import web

from kubesim import __version__, admission, openapi, protobuf, rbac
from kubesim.apiserver import ApiServer
from kubesim.bodies import (
    int_param,
    json_response,
    metadata_only_version,
    optional_json_object,
    partial_object_metadata,
    wants_table,
)
from kubesim.config import SimConfig
from kubesim.controllers import Cluster
from kubesim.errors import ApiError
from kubesim.faults import Faults, RequestCounters
from kubesim.guests import GuestManager
from kubesim.resources import BY_PATH, SUBRESOURCE_GROUP, ResourceType, group_document, group_list, resource_list
from kubesim.selectors import FieldSelector, LabelSelector, SelectorError
from kubesim.store import Store, Watcher
from kubesim.tables import to_table
from kubesim.watch import serve_watch

log = logging.getLogger("kubesim.server")

_STATUS_SUCCESS_ON_DELETE = {
    "secrets",
    "configmaps",
    "events",
    "networkpolicies",
    "resourcequotas",
    "limitranges",
    "roles",
    "rolebindings",
    "clusterroles",
    "clusterrolebindings",
}
_JSON = "application/json"
# The longest a list's encoding holds the event loop before it lets every watch, console and portforward stream on
# it go on: a list of a few hundred objects that changed since they were last encoded takes tens of milliseconds.
LIST_ENCODING_SLICE_SECONDS = 0.004


@dataclass
class Route:
    """What a request is about, for counting, faults and dispatch."""

    kind: str  # discovery | resource | subresource | admin | other
    verb: str = ""
    resource: str = ""  # "virtualmachines", "virtualmachineinstances/console", "discovery"
    rt: ResourceType | None = None
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    extra: tuple[str, ...] = ()
    version: str = ""


def _method_verb(method: str, *, named: bool, watch: bool) -> str:
    if method in ("GET", "HEAD"):
        return "watch" if watch else ("get" if named else "list")
    return {
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }.get(method, method.lower())


# Where the middleware leaves its reading of the request, and who sent it, for the handler.
ROUTE = web.RequestKey("route", Route)
USER = web.RequestKey("user", rbac.User)


def classify(method: str, path: str, query: Any) -> Route:
    parts = [p for p in path.split("/") if p]
    watching = query.get("watch") in ("true", "1", "True")
    if parts[:1] == ["kubesim"]:
        return Route("admin", verb=method.lower(), resource="/".join(parts[1:2]))
    if parts[:1] == ["api"]:
        group, version, rest = "", parts[1] if len(parts) > 1 else "", parts[2:]
        if len(parts) <= 2:
            return Route("discovery", verb="get", resource="discovery")
    elif parts[:1] == ["apis"]:
        if len(parts) <= 3:
            return Route("discovery", verb="get", resource="discovery")
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return Route("other", verb="get", resource="/".join(parts[:1]) or "root")
    if group == SUBRESOURCE_GROUP:
        if len(rest) >= 5 and rest[0] == "namespaces":
            resource = f"{rest[2]}/{rest[4]}"
            return Route(
                "subresource",
                verb="update" if method == "PUT" else "get",
                resource=resource,
                namespace=rest[1],
                name=rest[3],
                subresource=rest[4],
                extra=tuple(rest[5:]),
                version=version,
            )
        return Route(
            "subresource", verb="get", resource="/".join(rest) or "discovery", extra=tuple(rest), version=version
        )
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces" and (group, version, rest[2]) in BY_PATH:
        namespace, rest = rest[1], rest[2:]
    if not rest or (group, version, rest[0]) not in BY_PATH:
        return Route("resource", verb=method.lower(), resource="/".join(rest[:1]) or "unknown")
    rt = BY_PATH[(group, version, rest[0])]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    verb = _method_verb(method, named=bool(name), watch=watching)
    resource = f"{rt.plural}/{subresource}" if subresource else rt.plural
    return Route(
        "resource",
        verb=verb,
        resource=resource,
        rt=rt,
        namespace=namespace,
        name=name,
        subresource=subresource,
        extra=tuple(rest[3:]),
    )


def error_response(error: ApiError) -> web.Response:
    return json_response(error.status(), status=error.code, headers=error.headers)


async def encoded_items(entries: list[Any]) -> bytes:
    """The entries' JSON, comma-joined, handing the event loop back every ``LIST_ENCODING_SLICE_SECONDS``, as a
    real API server's other streams never wait for one client's list. An entry is an immutable snapshot (a write
    stores a new one), so what a list shows is still the store as it was when the list began."""
    parts = []
    deadline = time.perf_counter() + LIST_ENCODING_SLICE_SECONDS
    for entry in entries:
        parts.append(entry.json())
        if time.perf_counter() > deadline:
            await asyncio.sleep(0)
            deadline = time.perf_counter() + LIST_ENCODING_SLICE_SECONDS
    return b",".join(parts)


def _warning_headers(warnings: list[str]) -> dict[str, str]:
    # aiohttp takes one value per header name; the API server sends one Warning header per warning, and a
    # comma-separated list is equivalent (RFC 7234 §5.5).
    if not warnings:
        return {}
    return {"Warning": ", ".join(f'299 - "{_quoted(w)}"' for w in warnings)}


def _quoted(text: str) -> str:
    """A warning's text inside the header's quoted-string: backslashes and double quotes escaped, as the API
    server writes it."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


class KubeSim:
    """One simulated cluster: store, controllers, guests, faults and the aiohttp application."""

    def __init__(self, *, config: SimConfig, token: str, admin_token: str | None = None) -> None:
        self.config = config
        self.token = token
        self.admin_token = admin_token or token
        self.store = Store(history_size=config.watch_history)
        self.api = ApiServer(self.store)
        self.guests = GuestManager(config=config, store=self.store)
        self.guests.api = self.api
        self.cluster = Cluster(store=self.store, api=self.api, config=config, guests=self.guests)
        self.guests.record = self.cluster.record
        self.faults = Faults()
        self.rbac = rbac.Authorizer(self.store, enabled=config.rbac)
        self.counters = RequestCounters()
        self.consoles: set[Any] = set()
        self.portforwards: set[Any] = set()
        self.watches: set[Watcher] = set()
        self.started = time.time()

    # ---- application -------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        from kubesim import admin

        app = web.Application(middlewares=[self._middleware], client_max_size=32 * 1024 * 1024)
        app.router.add_route("GET", "/version", self.version)
        app.router.add_route("GET", "/version/", self.version)
        app.router.add_route("GET", "/healthz", self.healthz)
        app.router.add_route("GET", "/readyz", self.healthz)
        app.router.add_route("GET", "/livez", self.healthz)
        app.router.add_route("GET", "/openapi/v2", self.openapi_v2)
        app.router.add_route("GET", "/openapi/v3", self.openapi_v3_root)
        app.router.add_route("GET", "/openapi/v3/{path:.*}", self.openapi_v3_document)
        app.router.add_route("GET", "/api", self.api_versions)
        app.router.add_route("GET", "/api/", self.api_versions)
        app.router.add_route("GET", "/apis", self.api_groups)
        app.router.add_route("GET", "/apis/", self.api_groups)
        admin.register(app, self)
        app.router.add_route("*", "/api/{path:.*}", self.dispatch)
        app.router.add_route("*", "/apis/{path:.*}", self.dispatch)
        app.router.add_route("*", "/{path:.*}", self.not_found)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        # Load KubeVirt's schema now: a missing swagger.json stops the server at start, not at the first VM.
        admission.preload()
        self.cluster.bootstrap()
        rbac.load(self.api, rbac.BOOTSTRAP)
        for path in self.config.rbac_manifests:
            rbac.load(self.api, rbac.manifest_objects(path))

    async def _on_shutdown(self, app: web.Application) -> None:
        for watcher in list(self.watches):
            watcher.queue.put_nowait(None)
        for session in list(self.consoles) + list(self.portforwards):
            session.abort()
        self.guests.shutdown()

    def _token_user(self, token: str) -> rbac.User | None:
        if hmac.compare_digest(token, self.admin_token):
            return rbac.ADMIN
        if hmac.compare_digest(token, self.token):
            # With RBAC on, the portal's token is the portal's service account; otherwise it may do anything.
            return rbac.PORTAL if self.config.rbac else rbac.ADMIN
        return None

    def identify(self, request: web.Request) -> rbac.User | None:
        """Who sent the request, or None when it is not authenticated."""
        # A client certificate got through the TLS handshake only if kubesim's CA signed it (tls.self_signed): the
        # admin's, as kind and k3s write it (group system:masters).
        if request.transport is not None and request.transport.get_extra_info("peercert"):
            return rbac.ADMIN
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return self._token_user(header[7:].strip())
        # Browsers cannot set headers on WebSockets; kube-apiserver accepts the token as a subprotocol.
        for protocol in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
            protocol = protocol.strip()
            prefix = "base64url.bearer.authorization.k8s.io."
            if protocol.startswith(prefix):
                encoded = protocol[len(prefix) :]
                try:
                    decoded = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
                except (ValueError, UnicodeDecodeError):
                    return None
                return self._token_user(decoded)
        return None

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        user = self.identify(request)
        if user is None:
            return error_response(ApiError(401, "Unauthorized"))
        if request.headers.get("Impersonate-User"):
            try:
                user = rbac.impersonate(
                    user, request.headers["Impersonate-User"], request.headers.getall("Impersonate-Group", [])
                )
            except ApiError as error:
                return error_response(error)
        route = classify(request.method, request.path, request.query)
        request[ROUTE] = route
        request[USER] = user
        if route.kind != "admin":
            self.counters.count(route.verb, route.resource)
            delay = self.faults.latency_for(route.verb, route.resource)
            if delay > 0:
                await asyncio.sleep(delay)
            injected = self.faults.error_for(
                route.verb,
                route.resource,
                group=route.rt.group if route.rt else "",
                namespace=route.namespace,
                name=route.name,
            )
            if injected is not None:
                return error_response(injected)
        try:
            asked = rbac.attributes(route)
            if asked is not None:
                self.rbac.check(user, asked)
            return await handler(request)
        except ApiError as error:
            return error_response(error)
        except web.HTTPException:
            raise
        except ConnectionResetError:
            # The client left before the answer went out (a WebSocket handshake it gave up on, say): nothing went
            # wrong here and there is nobody to answer. The status only reaches the access log.
            log.debug("%s %s: the client went away before the answer", request.method, request.path)
            return web.Response(status=499)
        except Exception as exc:  # the client gets a Status, the operator a traceback in the log
            log.exception("%s %s failed", request.method, request.path)
            return error_response(ApiError(500, f"Internal error occurred: {exc!r}"))

    # ---- discovery ---------------------------------------------------------------------------------------
    async def version(self, request: web.Request) -> web.Response:
        major, minor = self.config.kubernetes_version.lstrip("v").split(".")[:2]
        return json_response(
            {
                "major": major,
                "minor": minor,
                "gitVersion": self.config.kubernetes_version,
                "gitCommit": "kubesim",
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.24.6",
                "compiler": "gc",
                "platform": "linux/amd64",
                "emulationMajor": major,
                "emulationMinor": minor,
            }
        )

    async def not_found(self, request: web.Request) -> web.Response:
        raise ApiError(404, "the server could not find the requested resource")

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def api_versions(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}],
            }
        )

    async def api_groups(self, request: web.Request) -> web.Response:
        return json_response(group_list())

    async def openapi_v2(self, request: web.Request) -> web.Response:
        raise ApiError(404, "the server could not find the requested resource")

    async def openapi_v3_root(self, request: web.Request) -> web.Response:
        return json_response(openapi.root_document())

    async def openapi_v3_document(self, request: web.Request) -> web.Response:
        document = openapi.group_version_document(request.match_info["path"])
        if document is None:
            raise ApiError(404, "the server could not find the requested resource")
        return json_response(document)

    # ---- REST --------------------------------------------------------------------------------------------
    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        route = request[ROUTE]
        parts = [p for p in request.path.split("/") if p]
        if route.kind == "discovery":
            return self._discovery(parts)
        if route.kind == "subresource":
            from kubesim import streams

            return await streams.dispatch(self, request, route)
        rt = route.rt
        if rt is None:
            raise ApiError(404, "the server could not find the requested resource")
        if rt.namespaced and route.name == "" and request.method not in ("GET", "DELETE") and not route.namespace:
            raise ApiError(404, "the server could not find the requested resource")
        if route.extra or (
            route.subresource
            and not (route.subresource == "status" and rt.status_subresource)
            and not (route.subresource == "eviction" and rt.plural == "pods")
        ):
            raise ApiError(404, "the server could not find the requested resource")
        query = request.query
        dry_run = "All" in query.getall("dryRun", [])
        field_validation = query.get("fieldValidation")
        namespace = route.namespace if rt.namespaced else ""
        if request.method in ("GET", "HEAD"):
            if route.name:
                return self._get(request, rt, namespace, route.name)
            if route.verb == "watch":
                labels, fields = self._selectors(request, rt)
                return await serve_watch(self, request, rt, namespace or None, labels, fields)
            return await self._list(request, rt, namespace or None)
        if request.method == "POST":
            if route.name and rt.plural == "pods" and route.subresource == "eviction":
                await self._body(request)  # policy/v1 Eviction; its delete options are not honoured
                return json_response(self.cluster.evict_pod(namespace, route.name), status=201)
            if route.name:
                raise ApiError(
                    405, "the server does not allow this method on the requested resource", reason="MethodNotAllowed"
                )
            body = await self._body(request)
            if rt.key == "selfsubjectaccessreviews":
                return json_response(self.rbac.review(request[USER], body), status=201)
            obj, warnings = self.api.create(rt, namespace, body, dry_run=dry_run, field_validation=field_validation)
            return json_response(obj, status=201, headers=_warning_headers(warnings))
        if request.method == "PUT" and route.name:
            body = await self._body(request)
            obj, warnings = self.api.update(
                rt,
                namespace,
                route.name,
                body,
                subresource=route.subresource or None,
                dry_run=dry_run,
                field_validation=field_validation,
            )
            return json_response(obj, headers=_warning_headers(warnings))
        if request.method == "PATCH" and route.name:
            body = await self._body(request)
            obj, warnings = self.api.patch(
                rt,
                namespace,
                route.name,
                request.headers.get("Content-Type", ""),
                body,
                subresource=route.subresource or None,
                dry_run=dry_run,
                field_validation=field_validation,
            )
            return json_response(obj, headers=_warning_headers(warnings))
        if request.method == "DELETE":
            options = await self._delete_options(request)
            if route.name:
                return self._delete(rt, namespace, route.name, options, dry_run=dry_run)
            return self._delete_collection(request, rt, namespace or None, options, dry_run=dry_run)
        raise ApiError(
            405, "the server does not allow this method on the requested resource", reason="MethodNotAllowed"
        )

    def _discovery(self, parts: list[str]) -> web.Response:
        if parts == ["api", "v1"]:
            return json_response(resource_list("", "v1"))
        if len(parts) == 2:
            document = group_document(parts[1])
        elif len(parts) == 3:
            document = resource_list(parts[1], parts[2])
        else:
            document = None
        if document is None:
            raise ApiError(404, "the server could not find the requested resource")
        return json_response(document)

    @staticmethod
    async def _body(request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            raise ApiError(400, "the request body is empty")
        content_type = request.headers.get("Content-Type", _JSON)
        if content_type.startswith(protobuf.MEDIA_TYPE):
            return protobuf.decode(raw)
        try:
            if "yaml" in content_type and "apply-patch" not in content_type:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError(400, f"the body of the request could not be decoded: {exc}") from exc

    @staticmethod
    async def _delete_options(request: web.Request) -> dict[str, Any]:
        options = await optional_json_object(request, what="DeleteOptions")
        query = request.query
        if "gracePeriodSeconds" in query:
            options["gracePeriodSeconds"] = int_param(query, "gracePeriodSeconds")
        if "propagationPolicy" in query:
            options["propagationPolicy"] = query["propagationPolicy"]
        if query.get("orphanDependents") in ("true", "false"):
            options["orphanDependents"] = query["orphanDependents"] == "true"
        return options

    def _get(self, request: web.Request, rt: ResourceType, namespace: str, name: str) -> web.Response:
        entry = self.store.entry(rt.key, namespace, name)
        if entry is None:
            from kubesim.errors import not_found

            raise not_found(rt.group_resource, name, kind_plural=rt.plural)
        if wants_table(request):
            return json_response(
                to_table(
                    rt.key,
                    [entry.obj],
                    resource_version=entry.obj["metadata"]["resourceVersion"],
                    include_object=request.query.get("includeObject", "Metadata"),
                )
            )
        version = metadata_only_version(request, kind="PartialObjectMetadata")
        if version:
            return json_response(partial_object_metadata(entry.obj, version=version))
        return json_response(entry.json())

    def _selectors(self, request: web.Request, rt: ResourceType) -> tuple[LabelSelector, FieldSelector]:
        try:
            labels = LabelSelector.parse(request.query.get("labelSelector"))
            fields = FieldSelector.parse(request.query.get("fieldSelector"), supported=rt.field_selectors)
        except SelectorError as exc:
            raise ApiError(400, str(exc)) from exc
        return labels, fields

    def _matching(self, request: web.Request, rt: ResourceType, namespace: str | None) -> list[Any]:
        labels, fields = self._selectors(request, rt)
        name = fields.exact_name()
        if name is not None and namespace is not None:
            entry = self.store.entry(rt.key, namespace, name)
            candidates = [entry] if entry else []
        else:
            candidates = self.store.entries(rt.key, namespace)
        return [e for e in candidates if labels.matches(e.obj["metadata"].get("labels")) and fields.matches(e.obj)]

    async def _list(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.Response:
        rv = str(self.store.rv)
        entries = self._matching(request, rt, namespace)
        entries.sort(key=lambda e: (e.obj["metadata"].get("namespace", ""), e.obj["metadata"]["name"]))
        continue_token = None
        token = request.query.get("continue")
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                start = tuple(state["start"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiError(400, "continue key is not valid") from exc
            entries = [
                e for e in entries if (e.obj["metadata"].get("namespace", ""), e.obj["metadata"]["name"]) > start
            ]
        limit = int_param(request.query, "limit")
        if limit > 0 and len(entries) > limit:
            entries = entries[:limit]
            last = entries[-1].obj["metadata"]
            continue_token = base64.urlsafe_b64encode(
                json.dumps({"rv": rv, "start": [last.get("namespace", ""), last["name"]]}).encode()
            ).decode()
        if wants_table(request):
            return json_response(
                to_table(
                    rt.key,
                    [e.obj for e in entries],
                    resource_version=rv,
                    include_object=request.query.get("includeObject", "Metadata"),
                    continue_token=continue_token,
                )
            )
        metadata: dict[str, Any] = {"resourceVersion": rv}
        if continue_token:
            metadata["continue"] = continue_token
            metadata["remainingItemCount"] = 0
        version = metadata_only_version(request, kind="PartialObjectMetadataList")
        if version:  # metadata only, as client-go's metadata informers list (a Secret's data stays home)
            return json_response(
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": f"meta.k8s.io/{version}",
                    "metadata": metadata,
                    "items": [partial_object_metadata(e.obj, version=version) for e in entries],
                }
            )
        head = json.dumps(
            {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": metadata}, separators=(",", ":")
        ).encode()
        body = head[:-1] + b',"items":[' + await encoded_items(entries) + b"]}"
        return json_response(body)

    def _delete(
        self, rt: ResourceType, namespace: str, name: str, options: dict[str, Any], *, dry_run: bool
    ) -> web.Response:
        propagation = options.get("propagationPolicy")
        if propagation is None and options.get("orphanDependents") is not None:
            propagation = "Orphan" if options["orphanDependents"] else "Background"
        grace = options.get("gracePeriodSeconds")
        if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int) or grace < 0):
            raise ApiError(400, f"gracePeriodSeconds must be a non-negative integer, not {grace!r}")
        obj, gone = self.api.delete(
            rt,
            namespace,
            name,
            grace_period=grace,
            propagation=propagation,
            preconditions=options.get("preconditions"),
            dry_run=dry_run,
        )
        if rt.key in _STATUS_SUCCESS_ON_DELETE:
            return json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": obj["metadata"].get("uid")},
                }
            )
        return json_response(obj, status=200 if gone else 202)

    def _delete_collection(
        self, request: web.Request, rt: ResourceType, namespace: str | None, options: dict[str, Any], *, dry_run: bool
    ) -> web.Response:
        items = []
        for entry in self._matching(request, rt, namespace):
            meta = entry.obj["metadata"]
            obj, _ = self.api.delete(
                rt,
                meta.get("namespace", ""),
                meta["name"],
                grace_period=options.get("gracePeriodSeconds"),
                propagation=options.get("propagationPolicy"),
                dry_run=dry_run,
            )
            items.append(obj)
        return json_response(
            {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(self.store.rv)},
                "items": items,
            }
        )

    def drop_watches(self, *, mode: str = "reset", resource: str | None = None) -> int:
        dropped = 0
        for watcher in list(self.watches):
            if resource and watcher.resource != resource:
                continue
            watcher.drop_mode = mode
            watcher.queue.put_nowait(None)
            dropped += 1
        return dropped

    def describe(self) -> dict[str, Any]:
        phases: dict[str, int] = {}
        for vmi in self.store.objects("virtualmachineinstances"):
            phase = (vmi.get("status") or {}).get("phase", "")
            phases[phase] = phases.get(phase, 0) + 1
        return {
            "version": __version__,
            "uptime_seconds": time.time() - self.started,
            "resource_version": self.store.rv,
            "virtual_machines": self.store.count("virtualmachines"),
            "vmi_phases": phases,
            "pods": self.store.count("pods"),
            "guests": len(self.guests.guests),
            "profile": self.config.profile,
            "accelerator": self.config.accelerator,
            "accelerator_reason": self.config.accelerator_reason,
            "reconciles": self.cluster.counters.reconciles,
            "controller_errors": self.cluster.counters.errors,
            "last_controller_error": self.cluster.counters.last_error,
            "open_watches": len(self.watches),
            "open_consoles": len(self.consoles),
            "open_portforwards": len(self.portforwards),
        }
