"""Core (pure, no I/O): the quota and billing pre-checks the claimer runs before it queues anything.

Facts (see docs/ARCHITECTURE.md, "Quota and billing before queueing"):
- Per-zone TPU quota lives in the Cloud Quotas API, service tpu.googleapis.com, as one QuotaInfo per quota ID
  (`projects/P/locations/global/services/tpu.googleapis.com/quotaInfos/ID`). Its `dimensionsInfos` hold one
  entry per zone that has its own value (`dimensions: {zone: Z}`), and at most one entry without a zone key: the
  value of every zone not listed on its own (limited to its `applicableLocations` when the API names them).
- Proto3 JSON leaves zeros out: `details: {}` is a limit of 0, and `details.value` is an int64, so a string.
  A zone with no entry and no default has no quota: a request there always fails.
- v4 quota counts TensorCores, like v4 type names (v4-32 is 32 TensorCores, 16 chips); v5e and v6e quota count
  chips, like their names. So a slice needs exactly the number in its name, in its quota's unit.
- Only the quota IDs below are known (cloud-tpu-facts.md). v2, v3, on-demand v4 and v5p have none here: their
  quota is the one the fleet file declares, and `tpuq fleet` says so.
- Billing: Cloud Billing's `projects/P/billingInfo`; `billingEnabled` is left out when false (proto3 JSON).
  Billing off makes the TPU API refuse everything, whatever quota remains.

The fleet file's `quota:` block is an override: a value declared for (zone, family, tier) wins over the API.
Racing never stops because a pre-check itself failed: an unreadable quota falls back to the declared one (or to
"not checked"), an unreadable billing state to "unknown", and each failure is one line for `tpuq fleet`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from tpuq.fleet import FleetFile, ProvisioningModel
from tpuq.tputypes import AcceleratorType, parse_accelerator_type, zone_region

TPU_SERVICE = "tpu.googleapis.com"


class QuotaUnit(str, Enum):
    chips = "chips"
    tensorcores = "TensorCores"


@dataclass(frozen=True)
class QuotaFact:
    quota_id: str
    unit: QuotaUnit


# (family, tier) -> the per-zone quota that bounds it. Nothing else is known: see the module docstring.
QUOTA_FACTS: dict[tuple[str, ProvisioningModel], QuotaFact] = {
    ("v4", ProvisioningModel.spot): QuotaFact("TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI", QuotaUnit.tensorcores),
    ("v5litepod", ProvisioningModel.spot): QuotaFact("TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI",
                                                     QuotaUnit.chips),
    ("v5litepod", ProvisioningModel.on_demand): QuotaFact("TPUV5sLitepodPerProjectPerZoneForTPUAPI", QuotaUnit.chips),
    ("v6e", ProvisioningModel.spot): QuotaFact("TPUV6EPreemptiblePerProjectPerZoneForTPUAPI", QuotaUnit.chips),
    ("v6e", ProvisioningModel.on_demand): QuotaFact("TPUV6EPerProjectPerZoneForTPUAPI", QuotaUnit.chips),
}
CORES_PER_CHIP = 2


def quota_fact(family: str, model: ProvisioningModel) -> QuotaFact | None:
    return QUOTA_FACTS.get((family, model))


def quota_info_name(project: str, quota_id: str) -> str:
    return f"projects/{project}/locations/global/services/{TPU_SERVICE}/quotaInfos/{quota_id}"


def units_needed(accel: AcceleratorType | str, unit: QuotaUnit) -> int:
    """What one slice of this type takes from a quota counted in `unit` (v4-32: 32 TensorCores or 16 chips)."""
    accel = parse_accelerator_type(accel) if isinstance(accel, str) else accel
    return accel.chips * CORES_PER_CHIP if unit is QuotaUnit.tensorcores else accel.chips


def chips_from_units(value: int, unit: QuotaUnit) -> int:
    """A quota value in its unit, as whole chips (the unit the claimer counts in)."""
    return value // CORES_PER_CHIP if unit is QuotaUnit.tensorcores else value


class QuotaInfoError(ValueError):
    """A QuotaInfo body that is not shaped as the Cloud Quotas API documents it."""


@dataclass(frozen=True)
class ZoneLimits:
    """One QuotaInfo's limits by zone, in the quota's own unit."""

    zones: Mapping[str, int] = field(default_factory=dict)
    regions: Mapping[str, int] = field(default_factory=dict)  # entries with a region key and no zone key
    default: int | None = None  # the entry without a zone key
    default_locations: frozenset[str] | None = None  # where that default applies; None: everywhere

    def limit(self, zone: str) -> int:
        if zone in self.zones:
            return self.zones[zone]
        if zone_region(zone) in self.regions:
            return self.regions[zone_region(zone)]
        if self.default is not None and (self.default_locations is None or zone in self.default_locations):
            return self.default
        return 0  # not listed, no default: this zone has no quota


def _int_value(details: Any, where: str) -> int:
    if details is None:
        return 0
    if not isinstance(details, dict):
        raise QuotaInfoError(f"{where}.details: expected an object, got {type(details).__name__}")
    raw = details.get("value", 0)  # proto3 JSON: a zero is left out, so `details: {}` is 0
    try:
        return int(raw)  # int64 comes as a string
    except (TypeError, ValueError):
        raise QuotaInfoError(f"{where}.details.value: not an integer: {raw!r}") from None


def parse_quota_info(body: Mapping[str, Any]) -> ZoneLimits:
    """Limits by zone from a QuotaInfo (v1 or v1beta: the same shape)."""
    infos = body.get("dimensionsInfos") or []
    if not isinstance(infos, list):
        raise QuotaInfoError("dimensionsInfos: expected a list")
    zones: dict[str, int] = {}
    regions: dict[str, int] = {}
    default: int | None = None
    locations: frozenset[str] | None = None
    for i, info in enumerate(infos):
        where = f"dimensionsInfos[{i}]"
        if not isinstance(info, dict):
            raise QuotaInfoError(f"{where}: expected an object")
        dimensions = info.get("dimensions") or {}
        value = _int_value(info.get("details"), where)
        if not isinstance(dimensions, dict):
            raise QuotaInfoError(f"{where}.dimensions: expected an object")
        if dimensions.get("zone"):
            zones[dimensions["zone"]] = value
        elif dimensions.get("region"):
            regions[dimensions["region"]] = value
        else:
            default = value
            applicable = info.get("applicableLocations")
            locations = frozenset(applicable) if applicable and "global" not in applicable else None
    return ZoneLimits(zones, regions, default, locations)


# ------------------------------------------------------------------ effective quota


class QuotaSource(str, Enum):
    declared = "declared"  # the fleet file's quota block
    api = "api"  # the Cloud Quotas API
    fallback = "fallback"  # no quota ID, or the API could not be read: declared if any, else not checked


@dataclass(frozen=True)
class QuotaReading:
    """What reading one quota ID gave: limits, or the one-line reason it could not be read."""

    quota_id: str
    limits: ZoneLimits | None = None
    error: str | None = None


@dataclass(frozen=True)
class ZoneQuota:
    chips: int | None  # None: not checked (nothing known, nothing declared)
    source: QuotaSource
    detail: str  # where the number came from, for `tpuq fleet`

    def describe(self) -> str:
        amount = "not checked" if self.chips is None else f"{self.chips} chips"
        return f"{amount} ({self.detail})"


@dataclass(frozen=True)
class EffectiveQuota:
    """Chips per (zone, family, tier) the claimer may hold, and where each number came from."""

    entries: Mapping[tuple[str, str, ProvisioningModel], ZoneQuota] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # one line per quota that could not be read

    def get(self, zone: str, family: str, model: ProvisioningModel) -> ZoneQuota | None:
        return self.entries.get((zone, family, model))

    def chips(self, zone: str, family: str, model: ProvisioningModel) -> int | None:
        entry = self.get(zone, family, model)
        return entry.chips if entry else None


def fleet_targets(fleet: FleetFile) -> list[tuple[str, str, ProvisioningModel]]:
    """The (zone, family, tier) triples the fleet may claim in, in fleet order."""
    out: dict[tuple[str, str, ProvisioningModel], None] = {}
    for entry in fleet.tpus:
        if entry.existing:
            continue
        for zone in entry.zones:
            out[(zone, entry.accelerator.family, entry.provisioning_model)] = None
    return list(out)


def wanted_quota_ids(fleet: FleetFile) -> list[str]:
    ids: dict[str, None] = {}
    for _, family, model in fleet_targets(fleet):
        fact = quota_fact(family, model)
        if fact is not None and not _all_declared(fleet, family, model):
            ids[fact.quota_id] = None
    return list(ids)


def _all_declared(fleet: FleetFile, family: str, model: ProvisioningModel) -> bool:
    return all(fleet.declared_quota_chips(z, f, m) is not None for z, f, m in fleet_targets(fleet)
               if (f, m) == (family, model))


def _tier(model: ProvisioningModel) -> str:
    return "spot" if model is ProvisioningModel.spot else "on-demand"


def effective_quota(fleet: FleetFile, readings: Mapping[str, QuotaReading]) -> EffectiveQuota:
    """Declared wins; else the API's value; else (no quota ID, or the read failed) not checked."""
    entries: dict[tuple[str, str, ProvisioningModel], ZoneQuota] = {}
    problems: dict[str, None] = {}
    for zone, family, model in fleet_targets(fleet):
        declared = fleet.declared_quota_chips(zone, family, model)
        fact = quota_fact(family, model)
        if declared is not None:
            entries[(zone, family, model)] = ZoneQuota(declared, QuotaSource.declared, "declared in the fleet file")
            continue
        if fact is None:
            entries[(zone, family, model)] = ZoneQuota(
                None, QuotaSource.fallback,
                f"no Cloud Quotas ID known for {family} {_tier(model)}: declare it in the fleet's quota block")
            continue
        reading = readings.get(fact.quota_id)
        if reading is None or reading.limits is None:
            error = reading.error if reading else "not read"
            problems[f"quota {fact.quota_id}: {error}; using the declared quota"] = None
            entries[(zone, family, model)] = ZoneQuota(None, QuotaSource.fallback,
                                                       f"{fact.quota_id} unreadable, none declared")
            continue
        value = reading.limits.limit(zone)
        entries[(zone, family, model)] = ZoneQuota(
            chips_from_units(value, fact.unit), QuotaSource.api,
            f"Cloud Quotas {fact.quota_id}: {value} {fact.unit.value} in {zone}")
    return EffectiveQuota(entries, tuple(problems))


def declared_quota(fleet: FleetFile) -> EffectiveQuota:
    """The fleet file's declarations alone (no API read): what decide uses when no pre-check was passed in."""
    entries = {}
    for zone, family, model in fleet_targets(fleet):
        chips = fleet.zone_quota_chips(zone, family, model)
        entries[(zone, family, model)] = ZoneQuota(chips, QuotaSource.declared, "declared in the fleet file")
    return EffectiveQuota(entries)


# ------------------------------------------------------------------ billing


@dataclass(frozen=True)
class BillingState:
    enabled: bool | None  # None: could not be read
    error: str | None = None

    @property
    def disabled(self) -> bool:
        return self.enabled is False


def parse_billing_info(body: Mapping[str, Any]) -> BillingState:
    return BillingState(enabled=bool(body.get("billingEnabled", False)))  # proto3 JSON leaves a false out


BILLING_OFF_MESSAGE = "Cloud Billing: billingEnabled false"  # a billing block's evidence, as its raw error


def billing_block_reason(project: str) -> str:
    """Short, with what to do; it clears by itself once Cloud Billing reports billing enabled (the claimer re-reads
    it on every message while blocked)."""
    return (f"billing is disabled on project {project}: enable it, then run `tpuq fleet unblock` (or wait: tpuq "
            "resumes by itself once Cloud Billing reports it enabled)")


@dataclass(frozen=True)
class Prechecks:
    """What the claimer's `decide` gets about the project before it queues: quota by zone, and billing."""

    quota: EffectiveQuota
    billing: BillingState = BillingState(None, "not read")
    read_at: Any = None  # the datetime of the reads (for the TTL cache and `tpuq fleet`)

    @property
    def problems(self) -> list[str]:
        lines = list(self.quota.problems)
        if self.billing.enabled is None and self.billing.error:
            lines.append(f"billing: {self.billing.error}; not checked")
        return lines


def skipped_zones(fleet: FleetFile, quota: EffectiveQuota) -> list[dict[str, str]]:
    """(zone, type) pairs the claimer never queues in, with the reason: less quota than one slice."""
    out = []
    for entry in fleet.tpus:
        if entry.existing:
            continue
        accel = entry.accelerator
        for zone in entry.zones:
            q = quota.get(zone, accel.family, entry.provisioning_model)
            if q is not None and q.chips is not None and q.chips < accel.chips:
                out.append({"zone": zone, "type": entry.type,
                            "reason": f"no quota: {q.chips} chips < {accel.chips} for one {entry.type} ({q.detail})"})
    return out
