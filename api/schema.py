"""drf-spectacular postprocessing: what the views cannot declare one by one. The refusals every operation shares,
request bodies that refuse unknown keys, and a student's lab told apart from a staff one."""

from __future__ import annotations

from typing import Any

ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
SIGNED_OUT = {
    "description": "No valid token or session.",
    "content": ERROR,
    "headers": {"WWW-Authenticate": {"schema": {"type": "string", "enum": ["Token"]}}},
}
LIST_REFUSALS = {
    "400": {"description": "A filter or ordering it cannot take.", "content": ERROR},
    "404": {"description": "No such page.", "content": ERROR},
}


def document_shared_refusals(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """401 wherever a sign-in is needed and 400 and 404 on every paginated list, in the error format; request
    bodies (every one a ``StrictInputSerializer``) take no other keys."""
    for path in result["paths"].values():
        for operation in path.values():
            responses = operation["responses"]
            if operation.get("security") and {} not in operation["security"]:
                responses.setdefault("401", SIGNED_OUT)
            if any(parameter["name"] == "page" for parameter in operation.get("parameters", [])):
                for status_code, response in LIST_REFUSALS.items():
                    responses.setdefault(status_code, response)
    schemas = result["components"]["schemas"]
    for name, component in schemas.items():
        if name.endswith("Request"):  # COMPONENT_SPLIT_REQUEST's name for a request body
            component["additionalProperties"] = False
    # A staff lab has every key of a student's and more: LabDetail's oneOf must match exactly one of the two.
    schemas["StudentLabDetail"]["additionalProperties"] = False
    return result
