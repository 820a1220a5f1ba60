"""What CreateQueuedResource accepts: the queued-resource id and the QueuedResource body, refused the way
the real API refuses them (INVALID_ARGUMENT with a BadRequest field violation, UNIMPLEMENTED for what the
fake leaves out)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tpuq.contracts.tputypes import AcceleratorType, UnknownAcceleratorType, parse_accelerator_type

from .errors import ApiError, invalid
from .multislice import multislice_params, slice_node_ids

_ID_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass
class ParsedCreate:
    node_id: str
    node_spec: dict
    accelerator: AcceleratorType
    spot: bool
    valid_until_offset: float | None
    valid_until_abs: datetime | None
    node_ids: tuple[str, ...] = ()  # one per slice: (node_id,) for a single node, <prefix>-0.. for multislice
    multislice: dict | None = None  # the multislice message as sent (multisliceParams / multiNodeParams)


def check_queued_resource_id(qr_id: str | None) -> None:
    """The queuedResourceId rules of the real API (RFC 1035 label, at most 63 characters)."""
    if not qr_id:
        raise invalid("queuedResourceId is required", "queued_resource_id")
    if not _ID_RE.match(qr_id):
        raise invalid(
            f"Invalid queuedResourceId '{qr_id}': it must be 1-63 characters of lowercase letters, "
            "digits and hyphens, start with a letter and not end with a hyphen",
            "queued_resource_id",
        )


def parse_create_body(parent: str, body: dict, qr_id: str = "", api_version: str = "v2") -> ParsedCreate:
    """The parts of a CreateQueuedResource body the model keeps; raises ApiError for what the API refuses."""
    if not isinstance(body, dict):
        raise invalid("Invalid JSON payload received: the body must be a QueuedResource object")
    tpu = body.get("tpu")
    if not isinstance(tpu, dict) or not isinstance(tpu.get("nodeSpec"), list) or not tpu["nodeSpec"]:
        raise invalid("QueuedResource.tpu.nodeSpec must contain one node spec", "queued_resource.tpu.node_spec")
    if len(tpu["nodeSpec"]) != 1:
        raise invalid("The fake Cloud TPU supports exactly one node spec", "queued_resource.tpu.node_spec")
    spec = tpu["nodeSpec"][0]
    if not isinstance(spec, dict):
        raise invalid("nodeSpec entries must be objects", "queued_resource.tpu.node_spec")
    if spec.get("parent") not in (None, parent):
        raise invalid(f"nodeSpec.parent '{spec.get('parent')}' does not match '{parent}'", "node_spec.parent")
    node_ids = slice_node_ids(spec, qr_id, api_version)  # multislice: instead of nodeId (multislice.py)
    node_id = node_ids[0] if node_ids else spec.get("nodeId")
    if not isinstance(node_id, str) or not _ID_RE.match(node_id):
        raise invalid(f"Invalid nodeId {node_id!r}", "queued_resource.tpu.node_spec.node_id")
    node = spec.get("node")
    if not isinstance(node, dict):
        raise invalid("nodeSpec.node is required", "queued_resource.tpu.node_spec.node")
    try:
        accelerator = parse_accelerator_type(str(node.get("acceleratorType") or ""))
    except UnknownAcceleratorType as e:
        raise invalid(
            f"Invalid acceleratorType {node.get('acceleratorType')!r}: {e}", "node.accelerator_type"
        ) from None
    if not node.get("runtimeVersion"):
        raise invalid("runtimeVersion is required", "node.runtime_version")
    metadata = node.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise invalid("node.metadata must map strings to strings", "node.metadata")
    tiers = [t for t in ("spot", "guaranteed", "bestEffort") if t in body]
    if len(tiers) > 1:
        raise invalid(f"Only one of spot, guaranteed, bestEffort may be set (got {', '.join(tiers)})", "tier")
    scheduling = node.get("schedulingConfig") or {}
    # gcloud alpha --provisioning-model=SPOT sends provisioningModel instead of spot {}.
    spot = (
        "spot" in body
        or "bestEffort" in body
        or body.get("provisioningModel") == "SPOT"
        or bool(scheduling.get("spot") or scheduling.get("preemptible"))
    )
    policy = body.get("queueingPolicy") or {}
    offset = None
    if "validUntilDuration" in policy:
        offset = _parse_duration(policy["validUntilDuration"], "queueing_policy.valid_until_duration")
        if offset <= 0:
            raise invalid("validUntilDuration must be positive", "queueing_policy.valid_until_duration")
    until = None
    if "validUntilTime" in policy:
        try:
            until = datetime.fromisoformat(str(policy["validUntilTime"]).replace("Z", "+00:00"))
        except ValueError:
            raise invalid("validUntilTime must be an RFC 3339 timestamp", "queueing_policy.valid_until_time") from None
        if until.tzinfo is None:
            raise invalid("validUntilTime must carry a time zone", "queueing_policy.valid_until_time")
    return ParsedCreate(node_id, node, accelerator, spot, offset, until, node_ids or (node_id,),
                        multislice_params(spec, api_version) if node_ids else None)


def _parse_duration(value: Any, field_name: str) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?s", value.strip()):
        return float(value.strip()[:-1])
    if isinstance(value, dict) and set(value) <= {"seconds", "nanos"}:
        return float(value.get("seconds", 0)) + float(value.get("nanos", 0)) / 1e9
    raise ApiError("INVALID_ARGUMENT", f"Invalid value at '{field_name}': expected a duration like \"3600s\"")
