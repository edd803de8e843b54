"""Validating the portal's manifests: KubeVirt kinds against KubeVirt's OpenAPI spec, core kinds against the
``kubernetes`` client's models. Both are strict about unknown fields, which the API server would drop or refuse."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
from kubernetes import client as k8s

# The copy kubesim ships (identical to shared/kubevirt/swagger.json), so the tests need nothing outside the repo.
SWAGGER = Path(__file__).resolve().parents[2] / "kubesim" / "swagger.json"


@functools.cache
def kubevirt_definitions() -> dict[str, Any]:
    """The spec's definitions, closed: an object schema with properties accepts no other keys."""
    definitions = copy.deepcopy(json.loads(SWAGGER.read_text())["definitions"])

    def close(schema: Any) -> None:
        if isinstance(schema, dict):
            if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema:
                schema["additionalProperties"] = False
            for value in schema.values():
                close(value)
        elif isinstance(schema, list):
            for value in schema:
                close(value)

    close(definitions)
    return definitions


def kubevirt_errors(obj: Any, definition: str) -> list[str]:
    """Every way ``obj`` breaks the ``#/definitions/<definition>`` schema (empty when it is valid)."""
    schema = {"$ref": f"#/definitions/{definition}", "definitions": kubevirt_definitions()}
    validator = jsonschema.Draft4Validator(schema)
    return [f"{'/'.join(str(p) for p in error.absolute_path)}: {error.message}" for error in validator.iter_errors(obj)]


def _check_type(value: Any, type_name: str, where: str, errors: list[str]) -> None:
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{where}: expected a list")
            return
        for index, item in enumerate(value):
            _check_type(item, type_name[5:-1], f"{where}[{index}]", errors)
    elif type_name.startswith(("dict(", "dict[")):  # the client wrote dict(str, X) before 36, dict[str, X] since
        inner = type_name[5:-1].split(", ", 1)[1]
        if not isinstance(value, dict):
            errors.append(f"{where}: expected a mapping")
            return
        for key, item in value.items():
            _check_type(item, inner, f"{where}.{key}", errors)
    elif type_name == "str" or type_name == "datetime":
        if not isinstance(value, str):
            errors.append(f"{where}: expected a string")
    elif type_name == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{where}: expected an integer")
    elif type_name == "bool":
        if not isinstance(value, bool):
            errors.append(f"{where}: expected a boolean")
    elif type_name == "object":
        return
    else:
        errors.extend(core_errors(value, type_name, where=where))


def core_errors(obj: Any, model: str, *, where: str = "") -> list[str]:
    """Every field of ``obj`` that the client's ``model`` (e.g. ``V1NetworkPolicy``) does not know or types
    differently, plus required fields the model refuses to be built without."""
    cls = getattr(k8s, model)
    if not isinstance(obj, dict):
        return [f"{where or model}: expected an object"]
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    errors: list[str] = []
    for key, value in obj.items():
        if key not in by_json:
            errors.append(f"{where}.{key}: {model} has no such field")
            continue
        _check_type(value, cls.openapi_types[by_json[key]], f"{where}.{key}", errors)
    if not where and not errors:
        try:
            k8s.ApiClient()._ApiClient__deserialize(obj, model)
        except ValueError as exc:
            errors.append(f"{model}: {exc}")
    return errors
