"""Admission: schema validation against KubeVirt's OpenAPI spec, then the rules of KubeVirt's webhooks."""

from __future__ import annotations

import copy
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from kubesim.errors import ApiError, invalid
from kubesim.quantity import QuantityError, parse_quantity

RUN_STRATEGIES = ("Always", "Halted", "Manual", "RerunOnFailure", "Once")
RUNNING_DEPRECATED_WARNING = "spec.running is deprecated, please use spec.runStrategy instead"
MUTUALLY_EXCLUSIVE = (
    "Running and RunStrategy are mutually exclusive. Note that Running is deprecated, please use RunStrategy instead"
)

_DEFINITIONS = {
    "VirtualMachine": "v1.VirtualMachine",
    "VirtualMachineInstance": "v1.VirtualMachineInstance",
    "KubeVirt": "v1.KubeVirt",
}
_WEBHOOKS = {
    "VirtualMachine": "virtualmachine-validator.kubevirt.io",
    "VirtualMachineInstance": "virtualmachineinstances-create-validator.kubevirt.io",
    "KubeVirt": "kubevirt-update-validator.kubevirt.io",
}


def swagger_path() -> Path:
    """Where KubeVirt's swagger.json lives: ``$KUBESIM_SWAGGER``, else the shared copy beside the repository."""
    configured = os.environ.get("KUBESIM_SWAGGER")
    if configured:
        return Path(configured)
    here = Path(__file__).resolve().parent
    for candidate in (
        here / "swagger.json",
        here.parent.parent / "shared" / "kubevirt" / "swagger.json",
        here.parent / "shared" / "kubevirt" / "swagger.json",
    ):
        if candidate.exists():
            return candidate
    raise FileNotFoundError("KubeVirt swagger.json not found; set KUBESIM_SWAGGER")


def _closed(schema: Any) -> Any:
    """Copy a schema, forbidding properties it does not declare (unknown fields are errors, not pruned)."""
    if isinstance(schema, dict):
        closed = {key: _closed(value) for key, value in schema.items() if key not in ("description", "default")}
        if "properties" in closed and "additionalProperties" not in closed:
            closed["additionalProperties"] = False
        return closed
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    return schema


def _inline(schema: Any, definitions: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """Replace ``$ref``s by the definitions they name: validating an inlined schema is a third faster.
    A definition that refers back to itself is left open below that point (KubeVirt's spec has none)."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            return {} if name in seen else _inline(definitions[name], definitions, seen + (name,))
        return {key: _inline(value, definitions, seen) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_inline(item, definitions, seen) for item in schema]
    return schema


# The request's ``fieldValidation`` values the API server accepts ("" and absent: Warn).
FIELD_VALIDATIONS = (None, "", "Ignore", "Warn", "Strict")


def check_field_validation(field_validation: str | None) -> None:
    """A request's ``fieldValidation`` the API server does not know is a 400, whatever the resource."""
    if field_validation not in FIELD_VALIDATIONS:
        raise ApiError(
            400,
            f'fieldValidation: Unsupported value: "{field_validation}": supported values: '
            + ", ".join(f'"{value}"' for value in FIELD_VALIDATIONS if value),
        )


@lru_cache(maxsize=1)
def _validators() -> dict[str, jsonschema.protocols.Validator]:
    with open(swagger_path()) as handle:
        definitions = _closed(json.load(handle)["definitions"])
    return {
        kind: jsonschema.Draft4Validator(_inline(definitions[definition], definitions, (definition,)))
        for kind, definition in _DEFINITIONS.items()
    }


def preload() -> None:
    """Read and compile the schemas (raises FileNotFoundError with a hint when swagger.json is missing)."""
    _validators()


def _field_path(path: Any) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _schema_causes(error: jsonschema.ValidationError) -> list[dict[str, str]]:
    where = _field_path(error.absolute_path)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return [{"reason": "FieldValueRequired", "field": _join(where, missing), "message": "Required value"}]
    if error.validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        actual = (
            type(error.instance)
            .__name__.replace("str", "string")
            .replace("dict", "object")
            .replace("list", "array")
            .replace("bool", "boolean")
            .replace("int", "integer")
        )
        return [
            {
                "reason": "FieldValueTypeInvalid",
                "field": where,
                "message": f'Invalid value: "{actual}": {where} in body must be of type {expected}: "{actual}"',
            }
        ]
    if error.validator == "enum":
        return [
            {
                "reason": "FieldValueNotSupported",
                "field": where,
                "message": f"Unsupported value: {json.dumps(error.instance)}: supported values: "
                + ", ".join(json.dumps(v) for v in error.validator_value),
            }
        ]
    return [{"reason": "FieldValueInvalid", "field": where, "message": f"Invalid value: {error.message}"}]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def validate_schema(obj: dict[str, Any], *, field_validation: str | None) -> tuple[dict[str, Any], list[str]]:
    """Validate apiVersion, kind, metadata and spec; returns the object, pruned of unknown fields, and the warnings
    to send.

    As the API server (v1.23+) does for a custom resource, by the request's ``fieldValidation``: unknown fields are
    pruned with a warning each when it is absent or ``Warn``, pruned silently with ``Ignore``, and refused with 400
    BadRequest (``strict decoding error``, before any other validation) with ``Strict``, which is what kubectl and
    the portal send (``check_field_validation`` refuses any other value).
    """
    check_field_validation(field_validation)
    kind = obj.get("kind", "")
    validator = _validators().get(kind)
    if validator is None:
        return obj, []
    checked = {key: value for key, value in obj.items() if key != "status"}
    causes: list[dict[str, str]] = []
    unknown: list[list[Any]] = []
    for error in validator.iter_errors(checked):
        if error.validator == "additionalProperties":
            declared = error.schema.get("properties", {})
            unknown.extend(list(error.absolute_path) + [key] for key in error.instance if key not in declared)
            continue
        causes.extend(_schema_causes(error))
    unknown_messages = sorted(f'unknown field "{_field_path(path)}"' for path in unknown)
    if unknown and field_validation == "Strict":
        raise ApiError(400, "strict decoding error: " + ", ".join(unknown_messages))
    name = obj.get("metadata", {}).get("name", "")
    if causes:
        group = obj.get("apiVersion", "").split("/")[0]
        raise invalid(kind, group, name, sorted(causes, key=lambda c: c["field"]))
    if unknown:
        obj = copy.deepcopy(obj)
        for path in unknown:
            node = obj
            for part in path[:-1]:
                node = node[part]
            node.pop(path[-1], None)
    return obj, [] if field_validation == "Ignore" else unknown_messages  # absent, "" and Warn: warned


def _webhook_denied(kind: str, causes: list[dict[str, str]]) -> ApiError:
    message = f'admission webhook "{_WEBHOOKS[kind]}" denied the request: {causes[0]["message"]}'
    return ApiError(422, message, details={"causes": causes})


def _vmi_spec_causes(spec: dict[str, Any], prefix: str) -> list[dict[str, str]]:
    """The part of KubeVirt's VMI spec validation a portal is most likely to trip over."""
    causes = []
    domain = spec.get("domain") or {}
    devices = domain.get("devices") or {}
    volumes = {v.get("name") for v in spec.get("volumes") or ()}
    for index, disk in enumerate(devices.get("disks") or ()):
        if disk.get("name") not in volumes:
            causes.append(
                {
                    "reason": "FieldValueInvalid",
                    "field": f"{prefix}.domain.devices.disks[{index}].name",
                    "message": f"{prefix}.domain.devices.disks[{index}].Name '{disk.get('name')}' not found.",
                }
            )
    networks = {n.get("name") for n in spec.get("networks") or ()}
    for index, interface in enumerate(devices.get("interfaces") or ()):
        if interface.get("name") not in networks:
            causes.append(
                {
                    "reason": "FieldValueInvalid",
                    "field": f"{prefix}.domain.devices.interfaces[{index}].name",
                    "message": f"{prefix}.domain.devices.interfaces[{index}].name '{interface.get('name')}' not found.",
                }
            )
    resources = domain.get("resources") or {}
    for section in ("requests", "limits"):
        for resource_name, value in (resources.get(section) or {}).items():
            try:
                parse_quantity(value)
            except QuantityError:
                causes.append(
                    {
                        "reason": "FieldValueInvalid",
                        "field": f"{prefix}.domain.resources.{section}.{resource_name}",
                        "message": f"{prefix}.domain.resources.{section}.{resource_name} "
                        f"'{value}': quantities must match the regular expression",
                    }
                )
    memory = domain.get("memory") or {}
    if (
        not (resources.get("requests") or {}).get("memory")
        and not memory.get("guest")
        and not (memory.get("hugepages") or {}).get("pageSize")
    ):
        causes.append(
            {
                "reason": "FieldValueRequired",
                "field": f"{prefix}.domain.resources.requests.memory",
                "message": "no memory requested, at least one of 'spec.domain.memory.guest', "
                "'spec.domain.memory.hugepages.size' or 'spec.domain.resources.requests.memory' "
                "must be set",
            }
        )
    return causes


def admit_virtual_machine(obj: dict[str, Any], *, decentralized_migration: bool = False) -> list[str]:
    """KubeVirt's VM validating webhook. Returns the warnings to send; raises 422 on denial."""
    spec = obj.get("spec") or {}
    causes = []
    has_running = spec.get("running") is not None
    has_strategy = spec.get("runStrategy") is not None
    if has_running and has_strategy:
        causes.append({"reason": "FieldValueInvalid", "field": "spec.running", "message": MUTUALLY_EXCLUSIVE})
    elif not has_running and not has_strategy:
        causes.append(
            {"reason": "FieldValueInvalid", "field": "spec.running", "message": "RunStrategy must be specified"}
        )
    elif has_strategy:
        allowed = RUN_STRATEGIES + (("WaitAsReceiver",) if decentralized_migration else ())
        if spec["runStrategy"] not in allowed:
            causes.append(
                {
                    "reason": "FieldValueInvalid",
                    "field": "spec.runStrategy",
                    "message": f"Invalid RunStrategy ({spec['runStrategy']})",
                }
            )
    template_spec = ((spec.get("template") or {}).get("spec")) or {}
    causes.extend(_vmi_spec_causes(template_spec, "spec.template.spec"))
    if causes:
        raise _webhook_denied("VirtualMachine", causes)
    return [RUNNING_DEPRECATED_WARNING] if has_running else []


def admit_virtual_machine_instance(obj: dict[str, Any]) -> list[str]:
    causes = _vmi_spec_causes(obj.get("spec") or {}, "spec")
    if causes:
        raise _webhook_denied("VirtualMachineInstance", causes)
    return []


def admit_kubevirt(obj: dict[str, Any]) -> list[str]:
    developer = (((obj.get("spec") or {}).get("configuration") or {}).get("developerConfiguration")) or {}
    enabled = set(developer.get("featureGates") or ())
    for gate in developer.get("disabledFeatureGates") or ():
        if gate in enabled:
            raise _webhook_denied(
                "KubeVirt",
                [
                    {
                        "reason": "FieldValueInvalid",
                        "field": "spec.configuration.developerConfiguration",
                        "message": f'feature gate "{gate}" exists on both "FeatureGates" and "DisabledFeatureGates"',
                    }
                ],
            )
    return []
