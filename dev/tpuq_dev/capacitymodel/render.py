"""How the Cloud TPU API (and the Cloud Quotas and Cloud Billing APIs it goes with) render the capacity model's
records as JSON: camelCase, enum names, RFC 3339 times, proto3 JSON's int64 strings and left-out zeros.

The fake's HTTP face (tpuq_dev.faketpu) serves these bodies; the fleet simulator hands the same bodies to the
services' clients in process, so both speak exactly what google-cloud-tpu parses.
"""

from __future__ import annotations

import zlib
from typing import Any

from tpuq.capacity.quota import QUOTA_FACTS, pool_family
from tpuq.contracts.tputypes import families, zone_region
from tpuq.contracts.tputypes import family as family_row

from .clock import rfc3339
from .errors import quota_id, region_quota_id
from .multislice import render_node_spec
from .model import FakeTpuWorld, NodeRecord, NodeState, Operation, QrState, QueuedResourceRecord
from .scenario import UNLIMITED

_STATE_DATA_FIELD = {
    QrState.CREATING: "creatingData",
    QrState.ACCEPTED: "acceptedData",
    QrState.PROVISIONING: "provisioningData",
    QrState.ACTIVE: "activeData",
    QrState.DELETING: "deletingData",
    QrState.SUSPENDING: "suspendingData",
    QrState.SUSPENDED: "suspendedData",
}
_ECHOED_QR_FIELDS = ("spot", "guaranteed", "bestEffort", "queueingPolicy", "reservationName", "provisioningModel")


def topology(chips: int, family: str) -> str:
    """acceleratorConfig.topology as the API reports it: v4-8 2x2x1, v4-32 2x2x4, v5litepod-64 8x8."""
    if family_row(family).topology_3d:  # 3-D tori (v4, v5p); the smallest slice is one 2x2x1 host
        dims, remaining = [2, 2, 1], max(1, chips // 4)
    else:
        dims, remaining = [1, 1], chips
    while remaining > 1:
        # Grow the last of the smallest dimensions: 2x2x2 -> 2x2x4 -> 2x4x4 -> 4x4x4.
        smallest = min(dims)
        last = max(i for i, d in enumerate(dims) if d == smallest)
        dims[last] *= 2
        remaining //= 2
    return "x".join(str(d) for d in dims)


def render_queued_resource(world: FakeTpuWorld, qr: QueuedResourceRecord, api_version: str = "v2") -> dict:
    parent = f"projects/{qr.project}/locations/{qr.zone}"
    out: dict[str, Any] = {
        "name": qr.name,
        "createTime": rfc3339(world.clock.wall(qr.create_time)),
        "tpu": {"nodeSpec": [render_node_spec(parent, qr.slice_ids, qr.multislice, qr.node_spec, api_version)]},
    }
    for key in _ECHOED_QR_FIELDS:
        if key in qr.body:
            out[key] = qr.body[key]
    state: dict[str, Any] = {"state": qr.state.value, "stateInitiator": qr.initiator}
    if qr.state == QrState.FAILED and qr.failed_error is not None:
        state["failedData"] = {"error": qr.failed_error.to_json()}
    elif qr.state in _STATE_DATA_FIELD:
        state[_STATE_DATA_FIELD[qr.state]] = {}
    out["state"] = state
    return out


def render_node(world: FakeTpuWorld, node: NodeRecord) -> dict:
    spec = node.spec
    out: dict[str, Any] = {
        "name": node.name,
        "acceleratorType": node.accelerator.name,
        "runtimeVersion": node.runtime_version,
        "state": node.state.value,
        "createTime": rfc3339(world.clock.wall(node.create_time)),
        "networkConfig": {"network": "default", "subnetwork": "default", **(spec.get("networkConfig") or {})},
        "cidrBlock": "10.130.0.0/20",
        "schedulingConfig": {"spot": True} if node.spot else {},
        "labels": spec.get("labels") or {},
        "metadata": spec.get("metadata") or {},
        "queuedResource": node.queued_resource,
        "acceleratorConfig": {
            "type": node.accelerator.generation,
            "topology": topology(node.accelerator.chips, node.accelerator.family),
        },
        "apiVersion": "V2",
        "id": str(zlib.crc32(node.name.encode()) * 7919),
    }
    if node.state == NodeState.READY:
        out.update(render_health(world, node))
    if node.endpoints and node.state == NodeState.READY:
        endpoints = []
        for e in node.endpoints:
            entry: dict[str, Any] = {"ipAddress": e.ip_address, "port": e.port}
            if e.external_ip:
                entry["accessConfig"] = {"externalIp": e.external_ip}
            endpoints.append(entry)
        out["networkEndpoints"] = endpoints
    for key in ("serviceAccount", "tags", "dataDisks", "description", "shieldedInstanceConfig"):
        if key in spec:
            out[key] = spec[key]
    return out


def render_health(world: FakeTpuWorld, node: NodeRecord) -> dict:
    """`health`, `healthDescription`, `symptoms` and `upcomingMaintenance` of a READY node, in tpu.v2's field names
    and enum names. Symptom times are scenario wall times like createTime; the maintenance window's times are the
    real times the fake will reach them (`Clock.real_wall`), because clients compare them with their own clock."""
    out: dict[str, Any] = {"health": node.health.value}
    if node.health_description:
        out["healthDescription"] = node.health_description
    if node.symptoms:
        out["symptoms"] = [{"createTime": rfc3339(world.clock.wall(s.at)), "symptomType": s.symptom_type.value,
                            **({"details": s.details} if s.details else {}), "workerId": str(s.worker)}
                           for s in node.symptoms]
    m = node.maintenance
    if m is not None:
        real = world.clock.real_wall
        out["upcomingMaintenance"] = {
            "type": m.type.value, "canReschedule": m.can_reschedule,
            "windowStartTime": rfc3339(real(m.start)), "windowEndTime": rfc3339(real(m.end)),
            "latestWindowStartTime": rfc3339(real(m.start)),
            "maintenanceStatus": m.status(world.clock.now()).value,
        }
    return out


def render_operation(world: FakeTpuWorld, op: Operation, api_version: str) -> dict:
    metadata: dict[str, Any] = {
        "@type": f"type.googleapis.com/google.cloud.tpu.{api_version}.OperationMetadata",
        "createTime": rfc3339(world.clock.wall(op.create_time)),
        "target": op.target,
        "verb": op.verb,
        "cancelRequested": False,
        "apiVersion": api_version,
    }
    if op.end_time is not None:
        metadata["endTime"] = rfc3339(world.clock.wall(op.end_time))
    out: dict[str, Any] = {"name": op.name, "metadata": metadata, "done": op.done}
    if op.done:
        if op.error is not None:
            out["error"] = op.error.to_json()
        elif op.response is not None:
            out["response"] = {
                "@type": f"type.googleapis.com/google.cloud.tpu.{api_version}.QueuedResource",
                **render_queued_resource(world, op.response, api_version),
            }
        else:
            out["response"] = {"@type": "type.googleapis.com/google.protobuf.Empty"}
    return out


TPU_SERVICE = "tpu.googleapis.com"
_TIERS = (("on_demand", False), ("spot", True))
FAKE_BILLING_ACCOUNT = "billingAccounts/000000-FAKE00-000000"


def quota_ids() -> dict[str, tuple[str, str, str]]:
    """Every TPU quota ID the fake serves -> (family, tier, "zone" | "region"): the per-zone and per-region IDs of
    every family (the fake's error catalogue), and the others tpuq reads (`tpuq.capacity.quota.QUOTA_FACTS`: v5e's serving
    IDs, which the fake reports from v5e's one quota: its scenario has no serving pool of its own)."""
    ids = {}
    for family in (row.name for row in families()):
        for tier, spot in _TIERS:
            ids[quota_id(family, spot)] = (family, tier, "zone")
            ids[region_quota_id(family, spot)] = (family, tier, "region")
    for (pool, model), facts in QUOTA_FACTS.items():
        for fact in facts:
            ids.setdefault(fact.quota_id, (pool_family(pool), model.value, fact.scope.value))
    return ids


def quota_units(family: str) -> tuple[int, str]:
    """(units per chip, unit name): the unit the family's type names count in."""
    unit = family_row(family).unit
    return unit.per_chip, unit.value


def _details(chips: int, per_chip: int) -> dict:
    """proto3 JSON: int64 as a string, zero left out; -1 (unlimited) is -1 in any unit."""
    value = chips if chips == UNLIMITED else chips * per_chip
    return {"value": str(value)} if value else {}


def render_quota_info(world: FakeTpuWorld, project: str, qid: str) -> dict:
    """A QuotaInfo from the scenario. Per zone: each zone that lists the family, then the default entry, over the
    scenario zones it covers (left out when it covers none: a zone without an entry whose region has a region
    quota is bounded by that alone). Per region: each region of `region_quota` that lists the family, and no
    default entry, so a region not listed has no region-wide limit."""
    family, tier, scope = quota_ids()[qid]
    per_chip, _ = quota_units(family)
    scenario = world.scenario
    infos = []
    if scope == "region":
        for region in sorted(scenario.region_quota):
            chips = scenario.region_quota_chips(region, family, tier)
            if chips is not None:
                infos.append({"dimensions": {"region": region}, "details": _details(chips, per_chip),
                              "applicableLocations": [region]})
    else:
        zones = sorted(scenario.zones)
        for zone in zones:  # most specific first: the zones that list the family on their own
            own = scenario.zones[zone].quota.get(family)
            if own is not None:
                infos.append({"dimensions": {"zone": zone}, "details": _details(getattr(own, tier), per_chip),
                              "applicableLocations": [zone]})
        default = scenario.default_quota.get(family)
        covered = zones if default else [
            z for z in zones if family in scenario.zones[z].quota
            or scenario.region_quota_chips(zone_region(z), family, tier) is None]
        if covered:
            infos.append({"details": _details(getattr(default, tier) if default else 0, per_chip),
                          "applicableLocations": covered})
    return {
        "name": f"projects/{project}/locations/global/services/{TPU_SERVICE}/quotaInfos/{qid}",
        "quotaId": qid,
        "service": TPU_SERVICE,
        "containerType": "PROJECT",
        "dimensions": [scope],
        "isPrecise": True,
        "dimensionsInfos": infos,
    }


def render_billing_info(world: FakeTpuWorld, project: str) -> dict:
    body = {"name": f"projects/{project}/billingInfo", "projectId": project}
    if not world.billing_disabled(project):
        body.update(billingAccountName=FAKE_BILLING_ACCOUNT, billingEnabled=True)
    return body
