"""Cloud-config written as block-style YAML, for people to read and cloud-init to load unchanged."""

from __future__ import annotations

from typing import Any

import yaml

# libyaml's emitter where PyYAML was built with it (its wheels are): the same document as the pure-Python emitter,
# which walks the agent's 13 KiB of base64 character by character in every VM's provisioning.
_SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _CloudConfigDumper(_SafeDumper):  # type: ignore[misc,valid-type]
    """PyYAML's safe dumper, writing multi-line text (unit files, scripts) as literal blocks people can read."""

    def ignore_aliases(self, data: Any) -> bool:
        return True  # a value used twice is written twice: no anchors in a document people read


def _represent_text(dumper: Any, text: str) -> yaml.ScalarNode:
    # PyYAML falls back to a quoted scalar by itself where a literal block cannot hold the text exactly, but
    # writes NEL literally in a single-quoted one, where its loader then reads a line break: double quotes escape it.
    style = '"' if "\x85" in text else "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_CloudConfigDumper.add_representer(str, _represent_text)


def dump_cloud_config(config: dict[str, Any]) -> str:
    """The mapping as block-style YAML that cloud-init (PyYAML's safe loader) reads back unchanged."""
    try:
        return yaml.dump(config, Dumper=_CloudConfigDumper, sort_keys=False, allow_unicode=True, width=4096)
    except yaml.representer.RepresenterError as exc:
        raise ValueError(f"cloud-config cannot hold this value: {exc}") from None
