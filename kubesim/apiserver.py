"""API server semantics over the store: create, update, patch, delete (graceful, with finalizers and owner
references), admission hooks and the garbage collector. HTTP lives in ``server.py``; controllers write through
the same methods with ``internal=True`` (no admission, no client restrictions).
"""

from __future__ import annotations

import base64
import binascii
import random
import re
from collections.abc import Callable
from typing import Any

import orjson

from kubesim import admission
from kubesim.errors import ApiError, already_exists, conflict, invalid, not_found
from kubesim.patch import json_patch, merge_patch
from kubesim.resources import BY_KEY, ResourceType
from kubesim.store import Store, now_rfc3339

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_GRACEFUL = {"pods", "virtualmachineinstances"}
VMI_FINALIZER = "kubevirt.io/foregroundDeleteVirtualMachine"
VM_FINALIZER = "kubevirt.io/virtualMachineControllerFinalize"


def clone(obj: Any) -> Any:
    """A deep copy of a JSON-shaped object (every stored object is one): a round trip through orjson, about twice
    as fast as pickle's and many times copy.deepcopy's."""
    return orjson.loads(orjson.dumps(obj))


def _random_suffix(rng: random.Random) -> str:
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))


class ApiServer:
    """The write path every object change goes through."""

    def __init__(self, store: Store, *, rng: random.Random | None = None) -> None:
        self.store = store
        self.rng = rng or random.Random()
        # Hooks the controllers register: VMI defaults at creation, the KubeVirt CR for admission.
        self.kubevirt_getter: Callable[[], dict[str, Any] | None] = lambda: None
        self.vmi_mutator: Callable[[dict[str, Any]], None] = lambda obj: None

    # ---- helpers -----------------------------------------------------------------------------------------
    def require(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        obj = self.store.get(rt.key, namespace if rt.namespaced else "", name)
        if obj is None:
            raise not_found(rt.group_resource, name, kind_plural=rt.plural)
        return obj

    def _check_namespace(self, rt: ResourceType, namespace: str, *, internal: bool) -> None:
        if not rt.namespaced:
            return
        ns = self.store.get("namespaces", "", namespace)
        if ns is None:
            raise not_found("namespaces", namespace, kind_plural="namespaces")
        if ns["metadata"].get("deletionTimestamp") and not internal:
            raise ApiError(
                403,
                f'{rt.plural} "" is forbidden: unable to create new content in namespace '
                f"{namespace} because it is being terminated",
                reason="Forbidden",
            )

    def _validate_name(self, rt: ResourceType, name: str) -> None:
        if rt.group == "rbac.authorization.k8s.io":
            # ValidateRBACName is path.IsValidPathSegmentName: "system:basic-user" is a valid name.
            if name in (".", "..") or "/" in name or "%" in name:
                raise invalid(
                    rt.kind,
                    rt.group,
                    name,
                    [
                        {
                            "reason": "FieldValueInvalid",
                            "field": "metadata.name",
                            "message": f"Invalid value: \"{name}\": may not contain '/' or '%'",
                        }
                    ],
                )
            return
        pattern = _DNS1123_LABEL if rt.key == "namespaces" else _DNS1123_SUBDOMAIN
        limit = 63 if rt.key == "namespaces" else 253
        if not pattern.match(name) or len(name) > limit:
            raise invalid(
                rt.kind,
                rt.group,
                name,
                [
                    {
                        "reason": "FieldValueInvalid",
                        "field": "metadata.name",
                        "message": f'Invalid value: "{name}": a lowercase RFC 1123 '
                        f"{'label' if rt.key == 'namespaces' else 'subdomain'} must consist of lower case "
                        "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                        "character",
                    }
                ],
            )

    def _admit(
        self, rt: ResourceType, obj: dict[str, Any], *, field_validation: str | None
    ) -> tuple[dict[str, Any], list[str]]:
        warnings: list[str] = []
        if rt.group == "kubevirt.io":  # validate_schema checks the fieldValidation value too
            obj, warnings = admission.validate_schema(obj, field_validation=field_validation)
            if rt.kind == "VirtualMachine":
                warnings += admission.admit_virtual_machine(obj)
            elif rt.kind == "VirtualMachineInstance":
                warnings += admission.admit_virtual_machine_instance(obj)
            elif rt.kind == "KubeVirt":
                warnings += admission.admit_kubevirt(obj)
        else:
            admission.check_field_validation(field_validation)
            if rt.key == "secrets":
                self._normalise_secret(obj)
        return obj, warnings

    @staticmethod
    def _normalise_secret(obj: dict[str, Any]) -> None:
        data = obj.get("data") or {}
        for key, value in data.items():
            try:
                base64.b64decode(value or "", validate=True)
            except (binascii.Error, TypeError) as exc:
                raise invalid(
                    "Secret",
                    "",
                    obj["metadata"].get("name", ""),
                    [{"reason": "FieldValueInvalid", "field": f"data[{key}]", "message": "illegal base64 data"}],
                ) from exc
        for key, value in (obj.pop("stringData", None) or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        if data:
            obj["data"] = data
        obj.setdefault("type", "Opaque")

    # ---- create ------------------------------------------------------------------------------------------
    def create(
        self,
        rt: ResourceType,
        namespace: str,
        body: Any,
        *,
        internal: bool = False,
        dry_run: bool = False,
        field_validation: str | None = None,
    ) -> tuple[dict[str, Any], list[str]]:
        if not isinstance(body, dict):
            raise ApiError(
                400,
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json, application/yaml",
            )
        obj = clone(body)
        self._check_type(rt, obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise ApiError(
                    400, "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + _random_suffix(self.rng)
            else:
                raise invalid(
                    rt.kind,
                    rt.group,
                    "",
                    [
                        {
                            "reason": "FieldValueRequired",
                            "field": "metadata.name",
                            "message": "Required value: name or generateName is required",
                        }
                    ],
                )
        self._validate_name(rt, meta["name"])
        self._check_namespace(rt, namespace, internal=internal)
        for field in (
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "selfLink",
            "managedFields",
        ):
            meta.pop(field, None)
        warnings: list[str] = []
        if not internal:
            if "create" not in rt.verbs:
                raise ApiError(
                    405,
                    f"the server does not allow this method on the requested resource ({rt.plural})",
                    reason="MethodNotAllowed",
                )
            obj, warnings = self._admit(rt, obj, field_validation=field_validation)
            meta = obj["metadata"]
            if rt.status_subresource:
                obj.pop("status", None)
        if rt.key not in ("events", "secrets", "configmaps", "namespaces", "nodes"):
            meta["generation"] = 1
        if rt.key == "namespaces":
            obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
            obj["status"] = {"phase": "Active"}
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        if rt.key == "virtualmachineinstances":
            self.vmi_mutator(obj)
        if self.store.get(rt.key, meta.get("namespace", ""), meta["name"]) is not None:
            raise already_exists(rt.group_resource, meta["name"], kind_plural=rt.plural)
        if dry_run:
            meta.setdefault("uid", "00000000-0000-0000-0000-000000000000")
            meta.setdefault("creationTimestamp", now_rfc3339())
            return obj, warnings
        return self.store.create(rt.key, obj), warnings

    @staticmethod
    def _check_type(rt: ResourceType, obj: dict[str, Any]) -> None:
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if kind and kind != rt.kind:
            raise ApiError(400, f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        if api_version and api_version != rt.api_version:
            raise ApiError(
                400,
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({rt.api_version})",
            )
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version

    # ---- update and patch --------------------------------------------------------------------------------
    def update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        internal: bool = False,
        dry_run: bool = False,
        field_validation: str | None = None,
        patched: bool = False,
    ) -> tuple[dict[str, Any], list[str]]:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        old = self.require(rt, namespace, name)
        obj = clone(body)
        self._check_type(rt, obj)
        meta = obj.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != name:
            raise ApiError(400, f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        wanted_rv = meta.get("resourceVersion")
        if not wanted_rv and rt.group == "kubevirt.io" and not internal and not patched:
            # Custom resources do not allow unconditional updates (AllowUnconditionalUpdate is false for CRDs).
            raise invalid(
                rt.kind,
                rt.group,
                name,
                [
                    {
                        "reason": "FieldValueInvalid",
                        "field": "metadata.resourceVersion",
                        "message": "Invalid value: 0x0: must be specified for an update",
                    }
                ],
            )
        if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
            raise conflict(rt.group_resource, name, kind_plural=rt.plural)
        if not internal and ("update" not in rt.verbs):
            raise ApiError(
                405,
                f"the server does not allow this method on the requested resource ({rt.plural})",
                reason="MethodNotAllowed",
            )
        if subresource == "status":
            new = clone(old)
            new["status"] = obj.get("status", {})
        elif subresource:
            raise not_found(rt.group_resource, name, kind_plural=rt.plural)
        else:
            new = obj
            if rt.status_subresource and "status" in old:
                new["status"] = clone(old["status"])
            elif rt.status_subresource:
                new.pop("status", None)
            if rt.key == "virtualmachineinstances" and not internal and new.get("spec") != old.get("spec"):
                raise admission._webhook_denied(
                    "VirtualMachineInstance",
                    [
                        {
                            "reason": "FieldValueNotSupported",
                            "field": "spec",
                            "message": "update of VMI object is restricted",
                        }
                    ],
                )
        warnings: list[str] = []
        if not internal and subresource != "status":
            new, warnings = self._admit(rt, new, field_validation=field_validation)
        for field in (
            "uid",
            "creationTimestamp",
            "namespace",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "generateName",
        ):
            if field in old["metadata"]:
                new["metadata"][field] = old["metadata"][field]
            else:
                new["metadata"].pop(field, None)
        new["metadata"]["name"] = name
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if "generation" in old["metadata"]:
            spec_changed = any(
                new.get(k) != old.get(k)
                for k in new.keys() | old.keys()
                if k not in ("metadata", "status", "apiVersion", "kind")
            ) or (not rt.status_subresource and new.get("status") != old.get("status"))
            if spec_changed:
                new["metadata"]["generation"] = old["metadata"]["generation"] + 1
        if new == old:
            return old, warnings
        if dry_run:
            return new, warnings
        stored = self.store.replace(rt.key, new)
        self._finish_if_finalized(rt, stored)
        return stored, warnings

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        body: Any,
        *,
        subresource: str | None = None,
        internal: bool = False,
        dry_run: bool = False,
        field_validation: str | None = None,
    ) -> tuple[dict[str, Any], list[str]]:
        old = self.require(rt, namespace, name)
        if not internal and "patch" not in rt.verbs:
            raise ApiError(
                405,
                f"the server does not allow this method on the requested resource ({rt.plural})",
                reason="MethodNotAllowed",
            )
        kind = content_type.split(";")[0].strip()
        if kind == "application/json-patch+json":
            new = json_patch(old, body)
        elif kind in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            # Strategic merge differs from a merge patch only for lists with patch keys; kubesim's
            # built-in types are patched by kubectl with whole maps, where the two agree.
            if not isinstance(body, dict):
                raise ApiError(400, "merge patch body must be a JSON object")
            new = merge_patch(old, body)
        elif kind == "application/apply-patch+yaml":
            raise ApiError(
                415,
                "server-side apply is not supported by kubesim; use client-side apply",
                reason="UnsupportedMediaType",
            )
        else:
            raise ApiError(
                415,
                f"the body of the request was in an unknown format - accepted media types "
                f"include: application/json-patch+json, application/merge-patch+json, "
                f"application/strategic-merge-patch+json (got {content_type!r})",
                reason="UnsupportedMediaType",
            )
        if not isinstance(new, dict):
            raise ApiError(422, "patched object is not a JSON object")
        return self.update(
            rt,
            namespace,
            name,
            new,
            subresource=subresource,
            internal=internal,
            dry_run=dry_run,
            field_validation=field_validation,
            patched=True,
        )

    def mutate(
        self, rt: ResourceType, namespace: str, name: str, change: Callable[[dict[str, Any]], Any]
    ) -> dict[str, Any] | None:
        """Controller write: apply ``change`` to a copy and store it if anything changed."""
        old = self.store.get(rt.key, namespace if rt.namespaced else "", name)
        if old is None:
            return None
        new = clone(old)
        change(new)
        if new == old:
            return old
        stored = self.store.replace(rt.key, new)
        self._finish_if_finalized(rt, stored)
        return stored

    # ---- delete ------------------------------------------------------------------------------------------
    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        *,
        grace_period: int | None = None,
        propagation: str | None = None,
        preconditions: dict[str, Any] | None = None,
        internal: bool = False,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Delete or start deleting; returns the object and whether it is gone already."""
        obj = self.require(rt, namespace, name)
        if not internal and "delete" not in rt.verbs:
            raise ApiError(
                405,
                f"the server does not allow this method on the requested resource ({rt.plural})",
                reason="MethodNotAllowed",
            )
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError(400, f"unsupported propagation policy {propagation!r}")
        preconditions = preconditions or {}
        if preconditions.get("uid") and preconditions["uid"] != obj["metadata"]["uid"]:
            raise ApiError(
                409,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, UID in object "
                f"meta: {obj['metadata']['uid']}",
            )
        if (
            preconditions.get("resourceVersion")
            and preconditions["resourceVersion"] != obj["metadata"]["resourceVersion"]
        ):
            raise conflict(rt.group_resource, name, kind_plural=rt.plural)
        if dry_run:
            return obj, False
        meta = obj["metadata"]
        uid = meta["uid"]
        if propagation == "Orphan":
            self._orphan_dependents(uid)
        finalizers = list(meta.get("finalizers") or ())
        if propagation == "Foreground" and self.store.dependents(uid) and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if grace_period is None:
            if rt.key == "pods":
                grace_period = int(obj.get("spec", {}).get("terminationGracePeriodSeconds", 30))
            elif rt.key == "virtualmachineinstances":
                grace_period = int(obj.get("spec", {}).get("terminationGracePeriodSeconds", 30))
            else:
                grace_period = 0
        if rt.key == "namespaces":
            finalizers = finalizers or []
        graceful = rt.key in _GRACEFUL and grace_period > 0
        namespace_finalizers = rt.key == "namespaces" and (obj.get("spec") or {}).get("finalizers")
        if finalizers or graceful or namespace_finalizers:
            if meta.get("deletionTimestamp"):
                # Already terminating: a second delete may only shorten the grace period.
                if grace_period < (meta.get("deletionGracePeriodSeconds") or 0):
                    return self.mutate(
                        rt,
                        namespace,
                        name,
                        lambda o: o["metadata"].__setitem__("deletionGracePeriodSeconds", grace_period),
                    ) or obj, False
                return obj, False

            def start_deleting(o: dict[str, Any]) -> None:
                o["metadata"]["deletionTimestamp"] = now_rfc3339()
                o["metadata"]["deletionGracePeriodSeconds"] = grace_period
                if finalizers:
                    o["metadata"]["finalizers"] = finalizers
                if rt.key == "namespaces":
                    o.setdefault("status", {})["phase"] = "Terminating"

            updated = self.mutate(rt, namespace, name, start_deleting)
            if propagation == "Foreground":
                self._delete_dependents(uid)
            return updated or obj, updated is None
        gone = self.remove(rt, namespace, name)
        return gone or obj, True

    def remove(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any] | None:
        """Take an object out of the store and collect its garbage (Background propagation)."""
        gone = self.store.remove(rt.key, namespace if rt.namespaced else "", name)
        if gone is None:
            return None
        self._delete_dependents(gone["metadata"]["uid"])
        self._release_foreground_owners(gone)
        return gone

    def _finish_if_finalized(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            if rt.key == "namespaces" and (obj.get("spec") or {}).get("finalizers"):
                return
            if rt.key in _GRACEFUL and (meta.get("deletionGracePeriodSeconds") or 0) > 0:
                return  # kubelet or virt-handler removes these once the workload has stopped
            self.remove(rt, meta.get("namespace", ""), meta["name"])

    def _delete_dependents(self, owner_uid: str) -> None:
        for resource, namespace, name in self.store.dependents(owner_uid):
            dependent = self.store.get(resource, namespace, name)
            if dependent is None or dependent["metadata"].get("deletionTimestamp"):
                continue
            self.delete(BY_KEY[resource], namespace, name, internal=True)

    def _orphan_dependents(self, owner_uid: str) -> None:
        def drop_reference(obj: dict[str, Any]) -> None:
            obj["metadata"]["ownerReferences"] = [
                ref for ref in obj["metadata"].get("ownerReferences", []) if ref.get("uid") != owner_uid
            ]

        for resource, namespace, name in self.store.dependents(owner_uid):
            self.mutate(BY_KEY[resource], namespace, name, drop_reference)

    def _release_foreground_owners(self, gone: dict[str, Any]) -> None:
        for ref in gone["metadata"].get("ownerReferences") or ():
            key = self.store.key_of_uid(ref.get("uid", ""))
            if key is None:
                continue
            owner = self.store.get(*key)
            if owner is None or "foregroundDeletion" not in (owner["metadata"].get("finalizers") or ()):
                continue
            if self.store.dependents(ref["uid"]):
                continue
            self.mutate(
                BY_KEY[key[0]],
                key[1],
                key[2],
                lambda o: o["metadata"].__setitem__(
                    "finalizers", [f for f in o["metadata"]["finalizers"] if f != "foregroundDeletion"]
                ),
            )
