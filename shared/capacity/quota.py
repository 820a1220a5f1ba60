"""Core (pure, no I/O): the quota and billing pre-checks the claimer runs before it queues anything.

Facts (see docs/ARCHITECTURE.md, "Quota and billing before queueing"):
- TPU quota lives in the Cloud Quotas API, service tpu.googleapis.com, as one QuotaInfo per quota ID
  (`projects/P/locations/global/services/tpu.googleapis.com/quotaInfos/ID`). Its `dimensionsInfos` hold one
  entry per zone (`dimensions: {zone: Z}`) or region (`dimensions: {region: R}`) that has its own value, and at
  most one entry without either: the value everywhere else (limited to its `applicableLocations` when the API
  names them). A zone's value: its zone entry, else its region's entry, else that default.
- Each pool has a per-zone and a per-region quota ID, and both are enforced: a refusal names either or both
  ("Quota limit 'TPUV2sPodPerProjectPerRegionForTPUAPI,TPUV2sPodPerProjectPerZoneForTPUAPI' has been exceeded.
  Limit: 0,0 in region us-central1,zone us-central1-a", BioMedBERT/biomedbert nohup.out; marin#87's names the
  region ID alone, production-facts.md). A region quota is shared by every zone of the region. A zone that the
  per-zone ID does not list while the per-region ID covers its region is bounded by the region alone.
- Proto3 JSON leaves zeros out: `details: {}` is a limit of 0, and `details.value` is an int64, so a string.
  `-1` is unlimited (production-facts.md, "Cloud Quotas values"). A zone neither ID covers has no quota: a
  request there always fails (cloud-tpu-facts.md).
- v4 quota counts TensorCores, like v4 type names (v4-32 is 32 TensorCores, 16 chips); v5e and v6e quota count
  chips, like their names. So a slice needs exactly the number in its name, in its quota's unit.
- v5e single-host slices (v5litepod-1, -4, -8) draw on the serving quotas (`...LitepodServing...`), not the
  training ones (production-facts.md; Cloud TPU quota docs: "TPU v5e uses separate quotas for training and
  serving"). So the quota a slice draws on is its pool (`quota_pool`): its family, or v5e's serving pool.
- Only the quota IDs the catalogue has on record are known (`tpuq.contracts.tputypes.FAMILIES`, `QuotaIds.on_record`;
  cloud-tpu-facts.md, production-facts.md). v2, v3, on-demand v4 and v5p have none: their quota is the one the
  fleet file declares, and `tpuq fleet` says so.
- Billing: Cloud Billing's `projects/P/billingInfo`; `billingEnabled` is left out when false (proto3 JSON).
  Billing off makes the TPU API refuse everything, whatever quota remains.

The fleet file's `quota:` block is an override: a value declared for (zone, family, tier) wins over the API (both
its zone and its region ID) in every pool of that family.
Racing never stops because a pre-check itself failed: an unreadable quota falls back to the declared one (or to
"not checked"), an unreadable billing state to "unknown", and each failure is one line for `tpuq fleet`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tpuq.contracts.fleet import FleetFile, ProvisioningModel
from tpuq.contracts.tputypes import AcceleratorType, Family, QuotaUnit, families, family, parse_accelerator_type, zone_region

TPU_SERVICE = "tpu.googleapis.com"
UNLIMITED = -1  # a Cloud Quotas value that means no limit (production-facts.md, "Cloud Quotas values")


class QuotaScope(str, Enum):
    zone = "zone"  # PerProjectPerZone: each zone its own value
    region = "region"  # PerProjectPerRegion: one value shared by every zone of the region


@dataclass(frozen=True)
class QuotaFact:
    quota_id: str
    unit: QuotaUnit
    scope: QuotaScope = QuotaScope.zone


def _pools(row: Family) -> Iterator[tuple[str, ProvisioningModel, tuple[QuotaFact, ...]]]:
    """(pool, tier, the quota IDs that bound it, the per-zone one first) of one family, for the IDs on record."""
    for pool, by_tier in ((row.name, row.quota), (row.serving_pool, row.serving_quota)):
        for model, ids in by_tier.items():
            if ids.on_record:
                facts = [QuotaFact(ids.zone, row.unit, QuotaScope.zone)]
                if ids.region:
                    facts.append(QuotaFact(ids.region, row.unit, QuotaScope.region))
                yield pool, model, tuple(facts)


class _QuotaFacts(Mapping):
    """(pool, tier) -> the quota IDs that bound it, the per-zone one first: the catalogue's IDs on record
    (`tpuq.contracts.tputypes.FAMILIES`), read from it when asked. Nothing else is known: see the docstring."""

    def _table(self) -> dict[tuple[str, ProvisioningModel], tuple[QuotaFact, ...]]:
        return {(pool, model): facts for row in families() for pool, model, facts in _pools(row)}

    def __getitem__(self, key: tuple[str, ProvisioningModel]) -> tuple[QuotaFact, ...]:
        return self._table()[key]

    def __iter__(self) -> Iterator[tuple[str, ProvisioningModel]]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


QUOTA_FACTS: Mapping[tuple[str, ProvisioningModel], tuple[QuotaFact, ...]] = _QuotaFacts()


def _serving_pools() -> dict[str, Family]:
    return {row.serving_pool: row for row in families() if row.serving_pool}


# v5e single-host slices' pool: the serving quotas, apart from v5e training's (the one family that has them).
SERVING_POOL = next(iter(_serving_pools()))


def quota_pool(accel: AcceleratorType | str) -> str:
    """The quota a slice draws on: its family's, or for a v5e single-host slice (1, 4, 8 chips) the serving one."""
    accel = parse_accelerator_type(accel) if isinstance(accel, str) else accel
    serving = family(accel.family).serving_pool
    return serving if serving and accel.hosts == 1 else accel.family


def pool_family(pool: str) -> str:
    """The family a pool belongs to: what the fleet file's `quota:` block is keyed by."""
    row = _serving_pools().get(pool)
    return row.name if row else pool


def quota_facts(pool: str, model: ProvisioningModel) -> tuple[QuotaFact, ...]:
    return QUOTA_FACTS.get((pool, model), ())


def quota_fact(pool: str, model: ProvisioningModel, scope: QuotaScope = QuotaScope.zone) -> QuotaFact | None:
    return next((f for f in quota_facts(pool, model) if f.scope is scope), None)


def quota_info_name(project: str, quota_id: str) -> str:
    return f"projects/{project}/locations/global/services/{TPU_SERVICE}/quotaInfos/{quota_id}"


def units_needed(accel: AcceleratorType | str, unit: QuotaUnit) -> int:
    """What one slice of this type takes from a quota counted in `unit` (v4-32: 32 TensorCores or 16 chips)."""
    accel = parse_accelerator_type(accel) if isinstance(accel, str) else accel
    return accel.chips * unit.per_chip


def chips_from_units(value: int, unit: QuotaUnit) -> int:
    """A quota value in its unit, as whole chips (the unit the claimer counts in). Not for UNLIMITED."""
    return value // unit.per_chip


class QuotaInfoError(ValueError):
    """A QuotaInfo body that is not shaped as the Cloud Quotas API documents it."""


@dataclass(frozen=True)
class ZoneLimits:
    """One QuotaInfo's limits by zone and region, in the quota's own unit (UNLIMITED: no limit)."""

    zones: Mapping[str, int] = field(default_factory=dict)
    regions: Mapping[str, int] = field(default_factory=dict)  # entries with a region key and no zone key
    default: int | None = None  # the entry with neither
    default_locations: frozenset[str] | None = None  # where that default applies (zones or regions); None: everywhere

    def _default_covers(self, *locations: str) -> bool:
        return self.default is not None and (
            self.default_locations is None or any(loc in self.default_locations for loc in locations))

    def find(self, zone: str) -> int | None:
        """The zone's value: its zone entry, else its region's, else the default; None: no entry covers it."""
        if zone in self.zones:
            return self.zones[zone]
        region = zone_region(zone)
        if region in self.regions:
            return self.regions[region]
        return self.default if self._default_covers(zone, region) else None

    def find_region(self, region: str) -> int | None:
        """A per-region quota's value for `region`: its region entry, else the default; None: not covered."""
        if region in self.regions:
            return self.regions[region]
        return self.default if self._default_covers(region) else None

    def limit(self, zone: str) -> int:
        value = self.find(zone)
        return 0 if value is None else value  # not listed, no default: this zone has no quota


def _int_value(details: Any, where: str) -> int:
    if details is None:
        return 0
    if not isinstance(details, dict):
        raise QuotaInfoError(f"{where}.details: expected an object, got {type(details).__name__}")
    raw = details.get("value", 0)  # proto3 JSON: a zero is left out, so `details: {}` is 0
    try:
        value = int(raw)  # int64 comes as a string
    except (TypeError, ValueError):
        raise QuotaInfoError(f"{where}.details.value: not an integer: {raw!r}") from None
    if value < UNLIMITED:
        raise QuotaInfoError(f"{where}.details.value: {value} is negative and not -1 (unlimited)")
    return value


def parse_quota_info(body: Mapping[str, Any]) -> ZoneLimits:
    """Limits by zone and region from a QuotaInfo (v1 or v1beta: the same shape)."""
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


def _amount(chips: int | None, unlimited: bool) -> str:
    return "unlimited" if unlimited else "not checked" if chips is None else f"{chips} chips"


@dataclass(frozen=True)
class RegionQuota:
    """A per-region quota: one number of chips shared by every zone of `region`."""

    region: str
    chips: int | None  # None: unlimited
    detail: str

    def describe(self) -> str:
        return f"region {self.region}: {_amount(self.chips, self.chips is None)} shared by its zones ({self.detail})"


@dataclass(frozen=True)
class ZoneQuota:
    """What bounds one (zone, pool, tier): the zone's own chips, and the region's shared ones when known."""

    chips: int | None  # the zone's own bound; None: none (not checked, unlimited, or its region's alone)
    source: QuotaSource
    detail: str  # where the number came from, for `tpuq fleet`
    unlimited: bool = False  # the API said -1
    region: RegionQuota | None = None

    @property
    def bound(self) -> int | None:
        """The most chips of the pool this zone can ever hold: its own limit or its region's, whichever is fewer;
        None: no bound."""
        known = [c for c in (self.chips, self.region.chips if self.region else None) if c is not None]
        return min(known) if known else None

    @property
    def is_unlimited(self) -> bool:
        """The API bounds nothing here: -1 for the zone (or no zone entry) and -1 or nothing for its region."""
        return self.source is QuotaSource.api and self.bound is None

    def describe(self) -> str:
        if self.chips is None and not self.unlimited and self.region is not None and self.source is QuotaSource.api:
            text = f"no zone limit ({self.detail})"
        else:
            text = f"{_amount(self.chips, self.unlimited)} ({self.detail})"
        return f"{text}; {self.region.describe()}" if self.region else text


@dataclass(frozen=True)
class EffectiveQuota:
    """Chips per (zone, pool, tier) the claimer may hold, and where each number came from. A pool is a family,
    or v5e's serving pool (`quota_pool`)."""

    entries: Mapping[tuple[str, str, ProvisioningModel], ZoneQuota] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # one line per quota that could not be read

    def get(self, zone: str, pool: str, model: ProvisioningModel) -> ZoneQuota | None:
        return self.entries.get((zone, pool, model))

    def of(self, zone: str, accel: AcceleratorType, model: ProvisioningModel) -> ZoneQuota | None:
        """The quota one slice of `accel` draws on in `zone`."""
        return self.get(zone, quota_pool(accel), model)

    def chips(self, zone: str, pool: str, model: ProvisioningModel) -> int | None:
        entry = self.get(zone, pool, model)
        return entry.chips if entry else None


def fleet_targets(fleet: FleetFile) -> list[tuple[str, str, ProvisioningModel]]:
    """The (zone, pool, tier) triples the fleet may claim in, in fleet order."""
    out: dict[tuple[str, str, ProvisioningModel], None] = {}
    for entry in fleet.tpus:
        if entry.existing:
            continue
        for zone in entry.zones:
            out[(zone, quota_pool(entry.accelerator), entry.provisioning_model)] = None
    return list(out)


def wanted_quota_ids(fleet: FleetFile) -> list[str]:
    """Every quota ID (per zone, then per region) of the pools the fleet claims in without declaring them."""
    ids: dict[str, None] = {}
    for _, pool, model in fleet_targets(fleet):
        if not _all_declared(fleet, pool, model):
            for fact in quota_facts(pool, model):
                ids[fact.quota_id] = None
    return list(ids)


def _all_declared(fleet: FleetFile, pool: str, model: ProvisioningModel) -> bool:
    return all(fleet.declared_quota_chips(z, pool_family(p), m) is not None for z, p, m in fleet_targets(fleet)
               if (p, m) == (pool, model))


def _tier(model: ProvisioningModel) -> str:
    return "spot" if model is ProvisioningModel.spot else "on-demand"


def _pool_label(pool: str) -> str:
    row = _serving_pools().get(pool)
    return f"{row.name} serving (single-host {row.short_name})" if row else pool


def _value_text(value: int, fact: QuotaFact) -> str:
    return "-1 (unlimited)" if value == UNLIMITED else f"{value} {fact.unit.value}"


def _region_quota(fact: QuotaFact | None, readings: Mapping[str, QuotaReading], zone: str,
                  problems: dict[str, None]) -> RegionQuota | None:
    if fact is None:
        return None
    reading = readings.get(fact.quota_id)
    if reading is None or reading.limits is None:
        problems[f"quota {fact.quota_id}: {reading.error if reading else 'not read'}; using the declared quota"] = None
        return None
    region = zone_region(zone)
    value = reading.limits.find_region(region)
    if value is None:
        return None  # the region has no entry of its own and no default covers it: no region-wide limit known
    chips = None if value == UNLIMITED else chips_from_units(value, fact.unit)
    return RegionQuota(region, chips, f"Cloud Quotas {fact.quota_id}: {_value_text(value, fact)} in {region}")


def effective_quota(fleet: FleetFile, readings: Mapping[str, QuotaReading]) -> EffectiveQuota:
    """Declared wins; else the API's values (the zone's, and its region's shared one); else (no quota ID, or the
    read failed) not checked."""
    entries: dict[tuple[str, str, ProvisioningModel], ZoneQuota] = {}
    problems: dict[str, None] = {}
    for zone, pool, model in fleet_targets(fleet):
        key = (zone, pool, model)
        declared = fleet.declared_quota_chips(zone, pool_family(pool), model)
        if declared is not None:
            entries[key] = ZoneQuota(declared, QuotaSource.declared, "declared in the fleet file")
            continue
        fact = quota_fact(pool, model)
        if fact is None:
            entries[key] = ZoneQuota(
                None, QuotaSource.fallback,
                f"no Cloud Quotas ID known for {_pool_label(pool)} {_tier(model)}: declare it in the fleet's quota "
                "block")
            continue
        reading = readings.get(fact.quota_id)
        unreadable = reading is None or reading.limits is None
        if unreadable:
            problems[f"quota {fact.quota_id}: {reading.error if reading else 'not read'}; using the declared quota"] \
                = None
        region = _region_quota(quota_fact(pool, model, QuotaScope.region), readings, zone, problems)
        if unreadable:
            entries[key] = ZoneQuota(None, QuotaSource.fallback, f"{fact.quota_id} unreadable, none declared",
                                     region=region)
            continue
        value = reading.limits.find(zone)
        if value is None and region is not None:  # the zone ID does not list it: its region's quota alone bounds it
            entries[key] = ZoneQuota(None, QuotaSource.api, f"Cloud Quotas {fact.quota_id}: no entry for {zone}",
                                     region=region)
            continue
        value = 0 if value is None else value  # neither ID covers the zone: no quota there
        entries[key] = ZoneQuota(
            None if value == UNLIMITED else chips_from_units(value, fact.unit), QuotaSource.api,
            f"Cloud Quotas {fact.quota_id}: {_value_text(value, fact)} in {zone}", unlimited=value == UNLIMITED,
            region=region)
    return EffectiveQuota(entries, tuple(problems))


def declared_quota(fleet: FleetFile) -> EffectiveQuota:
    """The fleet file's declarations alone (no API read): what decide uses when no pre-check was passed in."""
    entries = {}
    for zone, pool, model in fleet_targets(fleet):
        chips = fleet.zone_quota_chips(zone, pool_family(pool), model)
        entries[(zone, pool, model)] = ZoneQuota(chips, QuotaSource.declared, "declared in the fleet file")
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
    """(zone, type) pairs the claimer never queues in, with the reason: less quota than one slice, in the zone or
    in its region."""
    out = []
    for entry in fleet.tpus:
        if entry.existing:
            continue
        accel = entry.accelerator
        for zone in entry.zones:
            q = quota.of(zone, accel, entry.provisioning_model)
            if q is None:
                continue
            if q.chips is not None and q.chips < accel.chips:
                reason = f"no quota: {q.chips} chips < {accel.chips} for one {entry.type} ({q.detail})"
            elif q.region is not None and q.region.chips is not None and q.region.chips < accel.chips:
                reason = (f"no quota: region {q.region.region} has {q.region.chips} chips < {accel.chips} for one "
                          f"{entry.type} ({q.region.detail})")
            else:
                continue
            out.append({"zone": zone, "type": entry.type, "reason": reason})
    return out
