"""The TPU accelerator catalogue: one row per family (`FAMILIES`), and the arithmetic of a type name on it.

Pure data and arithmetic; every service, the CLI, the quota pre-checks and the capacity model (the fake TPU API
and the simulator) read a family's facts here, so "how many hosts does a v4-32 have" or "which quota does a spot
v6e draw on" has exactly one answer, and a new family is one row in `FAMILIES`. Everything else derives from
the rows and reads them when asked (never a copy made at import), so a test may swap the table.

Facts (see docs/ARCHITECTURE.md):
- v2, v3, v4 and v5p names count TensorCores (2 per chip); v5e (v5litepod) and v6e names count chips. A quota
  counts in the unit its family's names count in (v4-32 takes 32 of a v4 quota's TensorCores, 16 chips).
- v2/v3/v4/v5p hosts carry 4 chips. v5e/v6e single-host types (-1, -4, -8) have one host; multi-host slices
  carry 4 chips per host.
- Quota IDs (Cloud Quotas, service tpu.googleapis.com): each family has a per-zone and a per-region ID per tier
  (spot is the API's "Preemptible"). Only some are on record (cloud-tpu-facts.md, production-facts.md): the
  per-zone IDs `gcloud beta quotas info list --service=tpu.googleapis.com` lists and the per-region ones next to
  them ("PerRegion variants exist"; v4's is the one marin#87's refusal names). tpuq reads only those; for the
  rest (v2, v3, on-demand v4, v5p) the fleet file declares the quota, and the IDs here are the names the fake
  API uses in its refusals, after the pattern of the others. v5e single-host slices (-1, -4, -8) draw on the
  serving quotas, not the training ones ("TPU v5e uses separate quotas for training and serving", Cloud TPU
  quota docs); no per-region serving ID is on record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

# Hosts of 16 or more need internal IPs (external IP quota is 8 per region).
INTERNAL_IPS_FROM_HOSTS = 16


class ProvisioningModel(str, Enum):
    """The tier a slice is claimed in: what its quota IDs differ by."""

    spot = "spot"
    on_demand = "on_demand"


class QuotaUnit(str, Enum):
    """What a family's type names, and so its quotas, count."""

    chips = "chips"
    tensorcores = "TensorCores"

    @property
    def per_chip(self) -> int:
        return 2 if self is QuotaUnit.tensorcores else 1


@dataclass(frozen=True)
class QuotaIds:
    """The Cloud Quotas IDs that bound one tier of one family (or of its serving pool)."""

    zone: str  # PerProjectPerZone: each zone its own value; the ID the API's refusals name
    region: str | None = None  # PerProjectPerRegion: one value shared by the region's zones; None: none known
    on_record: bool = True  # tpuq reads it from the Cloud Quotas API; False: only the fake names it (see above)


@dataclass(frozen=True)
class Family:
    """Every fact tpuq knows about one TPU family: one row of `FAMILIES`."""

    name: str  # the canonical API name of the family, before the size: "v5litepod" in v5litepod-64
    generation: str  # a node's acceleratorConfig.type: V4, V5LITE_POD, V6E...
    unit: QuotaUnit  # what the number in a type name counts, and what the family's quotas count
    default_runtime: str  # runtimeVersion when the fleet entry names none
    quota: Mapping[ProvisioningModel, QuotaIds]  # the quota each tier draws on
    aliases: tuple[str, ...] = ()  # names users write for the family; the first is the one tpuq shows them
    chips_per_host: int = 4
    single_host_sizes: tuple[int, ...] = ()  # sizes (in `unit`) of one host with fewer chips than a full one
    serving_quota: Mapping[ProvisioningModel, QuotaIds] = field(default_factory=dict)  # single-host slices' quota
    topology_3d: bool = False  # acceleratorConfig.topology is a 3-D torus of 2x2x1 hosts (else a 2-D grid)
    single_slot: bool = False  # the quickstart's rule: claim one request at a time (`FleetEntry.single_slot`)
    # Multislice (several slices over the data-centre network, one queued resource): v4 and later; v2 and v3 take no
    # part (cloud.google.com/tpu/docs/multislice-introduction, "Accelerator type").
    multislice: bool = True
    example_size: int | None = None  # a size the "unknown TPU type" message shows as an example

    @property
    def short_name(self) -> str:
        """The name people know the family by: v5e for v5litepod."""
        return self.aliases[0] if self.aliases else self.name

    @property
    def serving_pool(self) -> str | None:
        """The quota pool of its single-host slices when they have one of their own (v5e's serving quotas)."""
        return f"{self.name}-serving" if self.serving_quota else None


_SPOT, _ON_DEMAND, _CORES, _CHIPS = ProvisioningModel.spot, ProvisioningModel.on_demand, QuotaUnit.tensorcores, \
    QuotaUnit.chips
_UBUNTU = "tpu-ubuntu2204-base"

# The catalogue: one row per family, in the order messages list them.
FAMILIES: tuple[Family, ...] = (
    Family("v2", "V2", _CORES, _UBUNTU, multislice=False, quota={
        _SPOT: QuotaIds("TPUV2sPreemptiblePodPerProjectPerZoneForTPUAPI",
                        "TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI", on_record=False),
        _ON_DEMAND: QuotaIds("TPUV2sPodPerProjectPerZoneForTPUAPI", "TPUV2sPodPerProjectPerRegionForTPUAPI",
                             on_record=False)}),
    Family("v3", "V3", _CORES, _UBUNTU, multislice=False, quota={
        _SPOT: QuotaIds("TPUV3sPreemptiblePodPerProjectPerZoneForTPUAPI",
                        "TPUV3sPreemptiblePodPerProjectPerRegionForTPUAPI", on_record=False),
        _ON_DEMAND: QuotaIds("TPUV3sPodPerProjectPerZoneForTPUAPI", "TPUV3sPodPerProjectPerRegionForTPUAPI",
                             on_record=False)}),
    Family("v4", "V4", _CORES, _UBUNTU, topology_3d=True, example_size=32, quota={
        _SPOT: QuotaIds("TPUV4sPreemptiblePodPerProjectPerZoneForTPUAPI",
                        "TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI"),
        _ON_DEMAND: QuotaIds("TPUV4sPodPerProjectPerZoneForTPUAPI", "TPUV4sPodPerProjectPerRegionForTPUAPI",
                             on_record=False)}),
    Family("v5p", "V5P", _CORES, "v2-alpha-tpuv5", topology_3d=True, quota={
        _SPOT: QuotaIds("TPUV5pPreemptiblePerProjectPerZoneForTPUAPI", "TPUV5pPreemptiblePerProjectPerRegionForTPUAPI",
                        on_record=False),
        _ON_DEMAND: QuotaIds("TPUV5pPerProjectPerZoneForTPUAPI", "TPUV5pPerProjectPerRegionForTPUAPI",
                             on_record=False)}),
    Family("v5litepod", "V5LITE_POD", _CHIPS, "v2-alpha-tpuv5-lite", aliases=("v5e",), single_host_sizes=(1, 4, 8),
           example_size=64, quota={
               _SPOT: QuotaIds("TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI",
                               "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI"),
               _ON_DEMAND: QuotaIds("TPUV5sLitepodPerProjectPerZoneForTPUAPI",
                                    "TPUV5sLitepodPerProjectPerRegionForTPUAPI")},
           serving_quota={
               _SPOT: QuotaIds("TPUV5sPreemptibleLitepodServingPerProjectPerZoneForTPUAPI"),
               _ON_DEMAND: QuotaIds("TPUV5sLitepodServingPerProjectPerZoneForTPUAPI")}),
    # Single-slot: the quickstart found v6e fills one request at a time; spreading them over zones alongside
    # other types' races does not help.
    Family("v6e", "V6E", _CHIPS, "v2-alpha-tpuv6e", single_host_sizes=(1, 4, 8), single_slot=True, example_size=8,
           quota={
               _SPOT: QuotaIds("TPUV6EPreemptiblePerProjectPerZoneForTPUAPI",
                               "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI"),
               _ON_DEMAND: QuotaIds("TPUV6EPerProjectPerZoneForTPUAPI", "TPUV6EPerProjectPerRegionForTPUAPI")}),
)


class UnknownAcceleratorType(ValueError):
    pass


def families() -> tuple[Family, ...]:
    """The catalogue's rows, read when asked (a test may swap `FAMILIES`)."""
    return FAMILIES


def _row(name: str) -> Family | None:
    return next((f for f in FAMILIES if name == f.name or name in f.aliases), None)


def family_named(name: str) -> Family | None:
    """The row of a family by its canonical name or an alias (any case, spaces around ignored), or None."""
    return _row(name.strip().lower())


def family(name: str) -> Family:
    """The row of a family tpuq already knows (an AcceleratorType's, a scenario's): KeyError otherwise."""
    row = family_named(name)
    if row is None:
        raise KeyError(f"unknown TPU family {name!r}")
    return row


@dataclass(frozen=True)
class AcceleratorType:
    name: str  # canonical API name, e.g. "v5litepod-64"
    family: str  # a row of FAMILIES, by its canonical name: "v4", "v5litepod", "v6e"...
    size: int  # the number in the name
    chips: int
    hosts: int
    default_runtime: str

    @property
    def needs_internal_ips(self) -> bool:
        return self.hosts >= INTERNAL_IPS_FROM_HOSTS

    @property
    def generation(self) -> str:
        """Generation label used in node acceleratorConfig.type (V4, V5LITE_POD, V6E...)."""
        return family(self.family).generation


def canonical_name(name: str) -> str:
    """`v5e-8` -> `v5litepod-8`; canonical names pass through unchanged."""
    family_part, _, size = name.strip().lower().partition("-")
    row = _row(family_part) if size else None
    canon = row.name if row is not None else family_part
    return f"{canon}-{size}" if size else name.strip().lower()


def _examples() -> str:
    shown = []
    for f in FAMILIES:
        if f.example_size is not None:
            alias = f" (or {f.aliases[0]}-{f.example_size})" if f.aliases else ""
            shown.append(f"{f.name}-{f.example_size}{alias}")
    return ", ".join(shown)


def _one_of(sizes: tuple[int, ...]) -> str:
    *most, last = sizes
    return f"{', '.join(map(str, most))} or {last}" if most else str(last)


_PARSED: dict[str, AcceleratorType] = {}  # name -> its parse (AcceleratorType is frozen: one serves every caller)
_PARSED_FROM: list = [None]  # the FAMILIES the parses were made from (a test may swap it: then parsed again)


def parse_accelerator_type(name: str) -> AcceleratorType:
    """`v5e-8` -> its AcceleratorType, or UnknownAcceleratorType. Every handler parses the same few names again
    and again: each is parsed once (refusals are not kept)."""
    if _PARSED_FROM[0] is not FAMILIES:
        _PARSED.clear()
        _PARSED_FROM[0] = FAMILIES
    parsed = _PARSED.get(name)
    if parsed is None:
        parsed = _parse_accelerator_type(name)
        if len(_PARSED) < 10_000:
            _PARSED[name] = parsed
    return parsed


def _parse_accelerator_type(name: str) -> AcceleratorType:
    canon = canonical_name(name)
    m = re.fullmatch(r"(.+)-(\d+)", canon)
    row = next((f for f in FAMILIES if f.name == m.group(1)), None) if m else None
    if row is None:
        raise UnknownAcceleratorType(f"unknown TPU type {name!r}: expected e.g. {_examples()}")
    size = int(m.group(2))
    if size <= 0:
        raise UnknownAcceleratorType(f"unknown TPU type {name!r}: size must be positive")
    per_chip, unit = row.unit.per_chip, row.unit.value
    one_host = row.chips_per_host * per_chip  # a full host, in the name's unit
    if row.single_host_sizes and size <= max(row.single_host_sizes):
        if size not in row.single_host_sizes:
            raise UnknownAcceleratorType(f"unknown TPU type {name!r}: single-host {row.name} sizes are "
                                         f"{_one_of(row.single_host_sizes)}")
        hosts = 1
    else:
        if size % one_host:
            multi = "multi-host " if row.single_host_sizes else ""
            raise UnknownAcceleratorType(
                f"unknown TPU type {name!r}: {multi}{row.name} sizes are multiples of {one_host} {unit}")
        hosts = size // one_host
    return AcceleratorType(canon, row.name, size, size // per_chip, hosts, row.default_runtime)


def zone_region(zone: str) -> str:
    """`us-central2-b` -> `us-central2`."""
    region, sep, suffix = zone.rpartition("-")
    if not sep or not region or len(suffix) != 1:
        raise ValueError(f"not a zone name: {zone!r} (expected e.g. us-central2-b)")
    return region
