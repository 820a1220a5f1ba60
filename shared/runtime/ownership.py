"""Is this cloud resource ours? Every delete in tpuq (claimer, janitor) goes through `is_ours`.

A resource is ours when both marks agree: its id starts with the fleet's owner
prefix, and its labels carry that owner (and, when present, that fleet). A
resource with only one mark (a user's node named "tpuq-...", or a copied label)
is never deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuq.contracts.documents import short_node_name
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.rawproto import has_field, raw_message

LABEL_OWNER = "tpuq-owner"
LABEL_FLEET = "tpuq-fleet"
LABEL_REQUEST = "tpuq-request"


def owner_labels(fleet: FleetFile, request_id: str | None = None) -> dict[str, str]:
    labels = {LABEL_OWNER: fleet.owner_prefix, LABEL_FLEET: fleet.name}
    if request_id:
        labels[LABEL_REQUEST] = request_id
    return labels


def _raw_name_and_labels(raw: Any) -> tuple[str, dict[str, str]]:
    labels = dict(raw.labels) if has_field(raw, "labels") else {}
    if not labels and has_field(raw, "tpu") and len(raw.tpu.node_spec):
        labels = dict(raw.tpu.node_spec[0].node.labels)
    return raw.name, labels


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        if obj is None:
            return None
        obj = obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)
    return obj


def name_and_labels(resource: Any) -> tuple[str, dict[str, str]]:
    """(full name, labels) of a tpu_v2 Node or QueuedResource, as API objects or REST dicts.

    A queued resource carries the labels of the node it asks for (tpu.nodeSpec[0].node.labels).
    """
    raw = raw_message(resource)
    if raw is not None:
        return _raw_name_and_labels(raw)
    name = _get(resource, "name") or ""
    labels = _get(resource, "labels")
    if not labels:
        specs = _get(resource, "tpu", "node_spec") or _get(resource, "tpu", "nodeSpec") or []
        labels = _get(specs[0], "node", "labels") if len(specs) else None
    return str(name), dict(labels or {})


def resource_name(resource: Any) -> str:
    """`name_and_labels(resource)[0]` without reading the labels (the janitor asks for names far more often)."""
    raw = raw_message(resource)
    if raw is not None:
        return raw.name
    return str(_get(resource, "name") or "")


def is_ours(resource: Any, fleet: FleetFile) -> bool:
    name, labels = name_and_labels(resource)
    if not short_node_name(name).startswith(f"{fleet.owner_prefix}-"):
        return False
    if labels.get(LABEL_OWNER) != fleet.owner_prefix:
        return False
    return labels.get(LABEL_FLEET, fleet.name) == fleet.name
