"""Multislice queued resources: one request for `nodeCount` slices of one type, provisioned all or none.

What the API takes and refuses, and what it makes of it (sources in dev/tpuq_dev/faketpu/MULTISLICE.md):
- v2 `QueuedResource.tpu.nodeSpec[].multisliceParams {nodeCount, nodeIdPrefix}`; v2alpha1 (gcloud alpha) names
  the same message `multiNodeParams` (gcloud's queued_resources/util.py: "For v2 API, MultiNodeParams was renamed
  to MultisliceParams"). It is given "instead of node_id" (tpu_v2 MultisliceParams).
- nodeCount: "Required ... This needs to be > 1." (tpu_v2 MultisliceParams.node_count).
- nodeIdPrefix: "Should follow the ^[A-Za-z0-9_.~+%-]+$ regex format. If node_count = 3 and node_id_prefix =
  "np", node ids of nodes created will be "np-0", "np-1", "np-2". If this field is not provided we use
  queued_resource_id as the node_id_prefix." (tpu.v2 discovery document, MultisliceParams.nodeIdPrefix).

Pure functions only: the capacity model (model.py) keeps the records and the clock.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tpuq.contracts.documents import TpuNodeState

from .errors import ApiError, invalid

if TYPE_CHECKING:
    from .model import FakeTpuWorld, QueuedResourceRecord
    from .scenario import Scenario

# The message's name in each API version (the fake serves both).
PARAMS_FIELD = {"v2": "multisliceParams", "v2alpha1": "multiNodeParams"}
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.~+%-]+$")
_NODE_ID_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # a node id is an RFC 1035 label like any other
TPU_ENV_ATTRIBUTE = "tpu-env"  # the metadata attribute JAX reads MEGASCALE_* from on a TPU VM


def multislice_params(spec: dict, api_version: str) -> dict | None:
    """The nodeSpec's multislice message as this API version names it; None for a single-node spec.

    The other version's name is an unknown field here, which the API refuses as it refuses any unknown JSON name."""
    own = PARAMS_FIELD.get(api_version, PARAMS_FIELD["v2"])
    for name in PARAMS_FIELD.values():
        if name != own and name in spec:
            raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. Unknown name \"{name}\" at "
                                               "'queued_resource.tpu.node_spec[0]': Cannot find field.")
    params = spec.get(own)
    if params is None:
        return None
    if not isinstance(params, dict):
        raise invalid(f"{own} must be an object", f"queued_resource.tpu.node_spec.{own}")
    return params


def slice_node_ids(spec: dict, qr_id: str, api_version: str) -> tuple[str, ...] | None:
    """The node ids a multislice nodeSpec makes (`<prefix>-0` .. `<prefix>-<n-1>`); None for a single-node spec.
    Raises ApiError (INVALID_ARGUMENT) for what the API refuses."""
    params = multislice_params(spec, api_version)
    if params is None:
        return None
    own = PARAMS_FIELD.get(api_version, PARAMS_FIELD["v2"])
    where = "queued_resource.tpu.node_spec." + re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), own)
    if spec.get("nodeId"):
        raise invalid(f"nodeId and {own} are exclusive: {own} is given instead of node_id", where)
    count = params.get("nodeCount")
    try:
        count = int(count)
    except (TypeError, ValueError):
        raise invalid(f"{own}.nodeCount is required", f"{where}.node_count") from None
    if count <= 1:
        raise invalid(f"{own}.nodeCount must be greater than 1, got {count}", f"{where}.node_count")
    prefix = params.get("nodeIdPrefix") or qr_id
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise invalid(f"Invalid nodeIdPrefix {prefix!r}: it must match ^[A-Za-z0-9_.~+%-]+$",
                      f"{where}.node_id_prefix")
    ids = tuple(f"{prefix}-{i}" for i in range(count))
    if not all(_NODE_ID_RE.match(node_id) for node_id in ids):
        # The prefix regex lets through names no node can have (capitals, dots); a node id is still a label.
        raise invalid(f"Invalid nodeIdPrefix {prefix!r}: node ids {ids[0]!r}.. must be 1-63 lowercase letters, "
                      "digits and hyphens, starting with a letter", f"{where}.node_id_prefix")
    return ids


def render_node_spec(parent: str, node_ids: tuple[str, ...], params: dict | None, node: dict, api_version: str) -> dict:
    """One nodeSpec entry as the API echoes it: nodeId for one node; for several, the multislice message as it was
    sent (nodeCount, and nodeIdPrefix only if given), under the reading version's name."""
    if params is None:
        return {"parent": parent, "nodeId": node_ids[0], "node": node}
    echoed = {"nodeCount": len(node_ids), **({"nodeIdPrefix": params["nodeIdPrefix"]} if params.get("nodeIdPrefix") else {})}
    return {"parent": parent, PARAMS_FIELD.get(api_version, PARAMS_FIELD["v2"]): echoed, "node": node}


def tpu_env(slice_id: int, num_slices: int, coordinator_address: str) -> str:
    """The `tpu-env` metadata attribute's MEGASCALE lines for one slice's workers, in the form JAX parses
    (jax/_src/clusters/cloud_tpu_cluster.py: "Typical line is MEGASCALE_NUM_SLICES: '2'"). The coordinator is
    worker 0 of slice 0 ("the Megascale coordinator address is set as the host with process id = 0")."""
    return (f"MEGASCALE_COORDINATOR_ADDRESS: '{coordinator_address}'\n"
            f"MEGASCALE_NUM_SLICES: '{num_slices}'\n"
            f"MEGASCALE_SLICE_ID: '{slice_id}'\n")


# Node states that hold hardware: a PREEMPTED or DELETING node's chips are back in the zone's pool.
_HOLDING = (TpuNodeState.CREATING, TpuNodeState.READY)


def zone_capacity(scenario: Scenario, zone: str, family: str) -> int | None:
    """The chips of `family` the zone has for everyone (scenario `zones.Z.capacity`); None: as many as asked."""
    zone_scenario = scenario.zones.get(zone)
    return None if zone_scenario is None else zone_scenario.capacity.get(family)


def capacity_short(world: FakeTpuWorld, qr: QueuedResourceRecord) -> bool:
    """Would the request's slices, all of them together, pass the zone's finite capacity? Gang provisioning: a
    multislice request waits until nodeCount x the type is free at once (Multislice overview, "Gang scheduling")."""
    limit = zone_capacity(world.scenario, qr.zone, qr.accelerator.family)
    if limit is None:
        return False
    held = sum(n.accelerator.chips for n in world.nodes.values()
               if n.zone == qr.zone and n.accelerator.family == qr.accelerator.family and n.state in _HOLDING)
    return held + qr.chips > limit
