"""The scenario file of the fake Cloud TPU: quota, capacity over time, delays, preemption, faults.

All times are scenario seconds since the server started (see `clock.py`). The
file is YAML validated with pydantic; `load_scenario(path)` raises
`ScenarioError` with one line per problem. The format is documented in README.md.

Evaluation helpers (`is_stocked_out`, `quota_limit`, ...) are pure: they take
the scenario time and any runtime overrides as arguments.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, Union

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError, field_validator,
                      model_validator)

from tpuq.contracts import yamltext
from tpuq.contracts.documents import MaintenanceType, SymptomType, TpuHealth
from tpuq.contracts.tputypes import families, zone_region

from .errors import ERROR_CLASSES
from .subnets import Subnetwork
from .timeline import AlternatingWindows, exponential, keyed_rng, keyed_uniforms, sample

Tier = Literal["spot", "on_demand"]


class ScenarioError(ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_family(value: str | None) -> str | None:
    names = [f.name for f in families()]
    if value is not None and value not in names:
        raise ValueError(f"unknown accelerator family {value!r}; expected one of {', '.join(names)}")
    return value


UNLIMITED = -1  # what Cloud Quotas reports for no limit (production-facts.md), and what a scenario writes for it


class FamilyQuota(_Strict):
    """Chips of one accelerator family a project may hold in one zone (or region); absent = 0, -1 = unlimited."""

    spot: int = Field(0, ge=UNLIMITED)
    on_demand: int = Field(0, ge=UNLIMITED)


class Window(_Strict):
    start: float = Field(0, ge=0)
    end: float | None = None  # None: until the end of time

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.end is not None and self.end <= self.start:
            raise ValueError(f"window end ({self.end}) must be after its start ({self.start})")
        return self

    def contains(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)


class Stockout(Window):
    """No capacity for `family` (all families if omitted) during [start, end)."""

    family: str | None = None
    # fail: requests that reach the capacity check fail with "no more capacity";
    # wait: they stay WAITING_FOR_RESOURCES until capacity returns.
    effect: Literal["fail", "wait"] = "fail"

    _family = field_validator("family")(_check_family)


class ScriptedFailure(Window):
    """Requests for `family` (all families if omitted) that reach the capacity check during [start, end) fail
    with the real error of class `error` (see errors.ERROR_CLASSES), as the real API writes it in failedData."""

    family: str | None = None
    error: str = "unknown"

    _family = field_validator("family")(_check_family)

    @field_validator("error")
    @classmethod
    def _error_class(cls, value: str) -> str:
        if value not in ERROR_CLASSES:
            raise ValueError(f"unknown error class {value!r}; expected one of {', '.join(ERROR_CLASSES)}")
        return value


# -- delay distributions (seconds) -------------------------------------------------------


class FixedDelay(_Strict):
    dist: Literal["fixed"]
    value: float = Field(ge=0)

    @property
    def typical(self) -> float:
        return self.value


class UniformDelay(_Strict):
    dist: Literal["uniform"]
    low: float = Field(ge=0)
    high: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> UniformDelay:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not be above high ({self.high})")
        return self

    @property
    def typical(self) -> float:
        return (self.low + self.high) / 2


class ExponentialDelay(_Strict):
    dist: Literal["exponential"]
    mean: float = Field(gt=0)

    @property
    def typical(self) -> float:
        return self.mean


class LognormalDelay(_Strict):
    """exp(N(ln median, sigma^2)): the median and the spread of the log (0.5 gives a p90 of about 1.9x the median)."""

    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)

    @property
    def typical(self) -> float:
        return self.median


DISTRIBUTIONS = ("fixed", "uniform", "exponential", "lognormal")


def _number_is_fixed(value: object) -> object:
    """A number is a fixed delay; anything else must name its distribution (one clear line otherwise)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"a delay must be 0 or more seconds, got {value}")
        return {"dist": "fixed", "value": value}
    if not isinstance(value, dict):
        raise ValueError(f"expected a number of seconds or {{dist: {'|'.join(DISTRIBUTIONS)}, ...}}, got {value!r}")
    if "dist" not in value:
        raise ValueError(f"a distribution needs dist: one of {', '.join(DISTRIBUTIONS)}")
    return value


# A number (a fixed delay) or {dist: fixed|uniform|exponential|lognormal, ...}.
Delay = Annotated[
    Union[FixedDelay, UniformDelay, ExponentialDelay, LognormalDelay],
    Field(discriminator="dist"),
    BeforeValidator(_number_is_fixed),
]


def fixed(seconds: float) -> FixedDelay:
    return FixedDelay(dist="fixed", value=seconds)


class StockoutModel(_Strict):
    """Stochastic stockouts of one family in one zone: out `fraction` of the time, in windows of mean length
    `mean_window` seconds (alternating exponential in-stock and out-of-stock periods, from the scenario seed)."""

    fraction: float = Field(ge=0, lt=1)
    mean_window: float = Field(gt=0)
    effect: Literal["fail", "wait"] = "fail"


class ZoneScenario(_Strict):
    quota: dict[str, FamilyQuota] = Field(default_factory=dict)
    stockouts: list[Stockout] = Field(default_factory=list)
    failures: list[ScriptedFailure] = Field(default_factory=list)
    stockout_model: dict[str, StockoutModel] = Field(default_factory=dict)  # per family
    # Per family: this zone's own delay distributions, in place of delays.waiting / delays.provisioning.
    waiting: dict[str, Delay] = Field(default_factory=dict)
    provisioning: dict[str, Delay] = Field(default_factory=dict)
    # Per family: chips the zone has for every project together (nodes CREATING or READY hold theirs); a request
    # that would pass it waits (WAITING_FOR_RESOURCES) until enough is freed. Absent: unlimited.
    capacity: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)

    _families = field_validator("quota", "stockout_model", "waiting", "provisioning", "capacity")(
        lambda value: _check_families(value))


_NO_ZONE = ZoneScenario()  # what a zone the scenario does not list has: nothing (built once: lookups are hot)


def _check_families(value: dict) -> dict:
    for family in value:
        _check_family(family)
    return value


class Delays(_Strict):
    """Scenario seconds spent in each state on the normal path."""

    accepted: float = Field(1, ge=0)  # ACCEPTED -> WAITING_FOR_RESOURCES (quota check here)
    # WAITING_FOR_RESOURCES -> PROVISIONING (capacity check here) and PROVISIONING -> ACTIVE: a number or a
    # distribution, drawn once per queued resource (Scenario.waiting_delay / provisioning_delay).
    waiting: Delay = Field(default_factory=lambda: fixed(5))
    provisioning: Delay = Field(default_factory=lambda: fixed(600))
    suspending: float = Field(30, ge=0)  # SUSPENDING -> SUSPENDED after a preemption
    deleting: float = Field(5, ge=0)  # DELETING -> gone
    # ACTIVE (every sshd up) -> the hosts' keys in guest attributes. On a real VM the guest agent publishes
    # them after boot, on its own schedule: a client must wait for them, never trust the first connection.
    host_keys: float = Field(0, ge=0)


class _NodeRule(_Strict):
    """Something that happens to matching ACTIVE nodes at scenario time `at`, or `after_active` seconds after each
    turns ACTIVE; `zone`, `family` and `node_id` narrow which nodes (absent: every one)."""

    at: float | None = Field(None, ge=0)
    after_active: float | None = Field(None, ge=0)
    zone: str | None = None
    family: str | None = None
    node_id: str | None = None

    _family = field_validator("family")(_check_family)

    @model_validator(mode="after")
    def _one_time(self):
        if (self.at is None) == (self.after_active is None):
            raise ValueError("give exactly one of 'at' or 'after_active'")
        return self

    def due_for(self, active_since: float) -> float | None:
        """When the rule fires for a node ACTIVE since then (None: an `at` that came before the node)."""
        if self.after_active is not None:
            return active_since + self.after_active
        return self.at if self.at is not None and self.at >= active_since else None

    def matches(self, zone: str, family: str, node_id: str) -> bool:
        return (
            (self.zone is None or self.zone == zone)
            and (self.family is None or self.family == family)
            and (self.node_id is None or self.node_id == node_id)
        )


class ScriptedPreemption(_NodeRule):
    """Preempt matching ACTIVE spot nodes at scenario time `at`, or `after_active` seconds after each turns ACTIVE."""


class ScriptedHealth(_NodeRule):
    """Matching READY nodes report `health` from then on (tpu.v2 Node.health; the node stays READY and its hosts
    keep running, as on a real TPU whose ML stack fails), with an optional `healthDescription` and one symptom
    (tpu.v2 Symptom) on `worker`. HEALTHY again clears the description and symptoms."""

    health: TpuHealth
    description: str | None = None
    symptom: SymptomType | None = None
    details: str | None = None
    worker: int = Field(0, ge=0)


class ScriptedMaintenance(_NodeRule):
    """Matching READY nodes get a maintenance notice (tpu.v2 Node.upcomingMaintenance, PENDING) when the rule
    fires; the window opens `notice` scenario seconds later and lasts `duration`. During the window the node reports
    UNHEALTHY_MAINTENANCE with the maintenance ONGOING; after it, HEALTHY and no upcoming maintenance."""

    notice: float = Field(7 * 86400, ge=0)  # SCHEDULED maintenance gets seven days' notice
    duration: float = Field(3600, gt=0)
    type: MaintenanceType = MaintenanceType.SCHEDULED
    can_reschedule: bool = True


class SpotLifetime(_Strict):
    """The mean (exponential) lifetime of spot nodes from ACTIVE, in `zone` and/or of `family` (absent: any)."""

    zone: str | None = None
    family: str | None = None
    mean: float = Field(gt=0)

    _family = field_validator("family")(_check_family)

    @field_validator("zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", value):
            raise ValueError(f"not a zone name: {value!r} (expected e.g. us-central2-b)")
        return value

    @property
    def specificity(self) -> int:
        """zone and family > zone > family > neither."""
        return 2 * (self.zone is not None) + (self.family is not None)


class Preemption(_Strict):
    mean_spot_lifetime: float | None = Field(None, gt=0)  # exponential, per node; the fallback of `lifetimes`
    lifetimes: list[SpotLifetime] = Field(default_factory=list)  # the most specific match wins
    scripted: list[ScriptedPreemption] = Field(default_factory=list)

    @field_validator("lifetimes")
    @classmethod
    def _distinct(cls, value: list[SpotLifetime]) -> list[SpotLifetime]:
        seen = set()
        for entry in value:
            key = (entry.zone, entry.family)
            if key in seen:
                raise ValueError(f"two lifetimes for zone {entry.zone or 'any'}, family {entry.family or 'any'}")
            seen.add(key)
        return value

    def mean_lifetime(self, zone: str, family: str) -> float | None:
        matches = [e for e in self.lifetimes if e.zone in (None, zone) and e.family in (None, family)]
        if matches:
            return max(matches, key=lambda e: e.specificity).mean
        return self.mean_spot_lifetime


class NodeHealthScenario(_Strict):
    """Health changes and maintenance notices of ACTIVE nodes, in scenario time (`health:` in the file)."""

    events: list[ScriptedHealth] = Field(default_factory=list)
    maintenance: list[ScriptedMaintenance] = Field(default_factory=list)


class Billing(_Strict):
    disabled: bool = False
    disabled_windows: list[Window] = Field(default_factory=list)
    # The Cloud Billing API refuses to say (403 PERMISSION_DENIED), as for a caller without a role on it.
    permission_denied: bool = False


class CloudQuotas(_Strict):
    """How the fake Cloud Quotas API answers besides the scenario's quota (which it always reports)."""

    # Quota IDs it answers 404 NOT_FOUND for, as if renamed (the quickstart: IDs change between versions).
    unknown_ids: list[str] = Field(default_factory=list)
    # Every read refused with 403 PERMISSION_DENIED, as for a caller without roles/cloudquotas.viewer.
    permission_denied: bool = False


class FirewallPorts(_Strict):
    """compute v1 Firewall.allowed[] / denied[]: a protocol and, optionally, ports or ranges ("22", "8000-8100")."""

    IPProtocol: str
    ports: list[str] = Field(default_factory=list)


class FirewallRule(_Strict):
    """A VPC firewall rule the fake's compute `firewalls.list` reports, in compute v1's own field names. The
    fake fills in what Compute Engine does for a rule made without them (priority 1000, INGRESS, network
    `default`, the network as a URL)."""

    name: str
    network: str = "default"
    direction: Literal["INGRESS", "EGRESS"] = "INGRESS"
    priority: int = Field(1000, ge=0, le=65535)
    sourceRanges: list[str] = Field(default_factory=list)
    sourceTags: list[str] = Field(default_factory=list)
    sourceServiceAccounts: list[str] = Field(default_factory=list)
    destinationRanges: list[str] = Field(default_factory=list)
    targetTags: list[str] = Field(default_factory=list)
    targetServiceAccounts: list[str] = Field(default_factory=list)
    allowed: list[FirewallPorts] = Field(default_factory=list)
    denied: list[FirewallPorts] = Field(default_factory=list)
    disabled: bool = False
    description: str | None = None


class Network(_Strict):
    """Where the client that SSHes to the workers sits, which decides which of a worker's addresses answers.

    internal: inside the VPC (a vpc or iap fleet's executor), so sshd answers on the internal address only;
    external: on the internet (a direct fleet's executor), so sshd answers on the external address only.
    The other address is allocated and held but serves nothing, so a client that picks the wrong
    `networkEndpoints` field is refused, as it would be in a real project.
    """

    ssh_reachable: Literal["internal", "external"] = "internal"
    # In-use external IP addresses a project may hold per region (Compute Engine's IN_USE_ADDRESSES; 8 by default
    # in a real project). A node created with enableExternalIps holds one per host from PROVISIONING until it is
    # deleted; a request that would pass the limit FAILs at the capacity check with the IN_USE_ADDRESSES text.
    # A region not listed here has no limit (the default scenario lists none).
    external_ip_quota: dict[str, int] = Field(default_factory=dict)
    # The VPC firewall rules of every project (compute v1 `firewalls.list` on the fake's Google APIs URL), as a
    # project's owner made them; none by default, like a project whose default network lost its rules.
    # `/_fake/firewalls` replaces them per project. They are reported, never enforced: the worker hosts are
    # reached over loopback.
    firewalls: list[FirewallRule] = Field(default_factory=list)
    # Subnets are regional (tpuq_dev.capacitymodel.subnets: a subnet of each auto-mode network's name in every region,
    # the custom-mode `subnetworks` only where listed; `[]`: no auto-mode network). A TPU create must name one there.
    auto_mode_networks: list[str] = Field(default_factory=lambda: ["default"])
    subnetworks: list[Subnetwork] = Field(default_factory=list)

    @field_validator("external_ip_quota")
    @classmethod
    def _regions(cls, value: dict[str, int]) -> dict[str, int]:
        for region, limit in value.items():
            if not re.fullmatch(r"[a-z]+-[a-z]+\d+", region):
                raise ValueError(f"not a region name: {region!r} (expected e.g. us-central2)")
            if limit < 0:
                raise ValueError(f"{region}: the external IP quota must be 0 or more, got {limit}")
        return value


class Scenario(_Strict):
    seed: int = 0
    zones: dict[str, ZoneScenario] = Field(default_factory=dict)
    # The quota of every scenario zone that does not list the family on its own (the Cloud Quotas entry with no
    # zone key). A zone that lists the family, even with 0 for a tier, keeps its own value.
    default_quota: dict[str, FamilyQuota] = Field(default_factory=dict)
    # Per-region quota (the PerProjectPerRegion IDs), region -> family: one number shared by every zone of the
    # region, enforced on top of the zone's own. A scenario zone that lists no quota for the family, in a scenario
    # without a default for it, is then bounded by its region's alone (the zone ID has no entry for it).
    region_quota: dict[str, dict[str, FamilyQuota]] = Field(default_factory=dict)
    cloud_quotas: CloudQuotas = Field(default_factory=CloudQuotas)
    delays: Delays = Field(default_factory=Delays)
    preemption: Preemption = Field(default_factory=Preemption)
    health: NodeHealthScenario = Field(default_factory=NodeHealthScenario)
    billing: Billing = Field(default_factory=Billing)
    network: Network = Field(default_factory=Network)
    # The stockout_model windows drawn so far, per (zone, family): a memo of a pure function of the seed.
    _generated: dict[tuple[int, str, str], tuple[AlternatingWindows, StockoutModel, list[Stockout]]] = PrivateAttr(
        default_factory=dict)

    @field_validator("zones")
    @classmethod
    def _zone_names(cls, value: dict[str, ZoneScenario]) -> dict[str, ZoneScenario]:
        for zone in value:
            zone_region(zone)  # raises ValueError with a clear message
            if not re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", zone):
                raise ValueError(f"not a zone name: {zone!r} (expected e.g. us-central2-b)")
        return value

    _default_families = field_validator("default_quota")(lambda value: _check_families(value))

    @field_validator("region_quota")
    @classmethod
    def _region_quota(cls, value: dict[str, dict[str, FamilyQuota]]) -> dict[str, dict[str, FamilyQuota]]:
        for region, families in value.items():
            if not re.fullmatch(r"[a-z]+-[a-z]+\d+", region):
                raise ValueError(f"not a region name: {region!r} (expected e.g. us-central2)")
            _check_families(families)
        return value

    # -- evaluation ----------------------------------------------------------

    def has_zone(self, zone: str) -> bool:
        return zone in self.zones

    def zone_quota_chips(self, zone: str, family: str, tier: Tier) -> int | None:
        """The zone's own chips as the zone ID reports them (UNLIMITED included): its entry for the family, else the
        default entry (scenario zones only); None: neither (no zone entry)."""
        own = self.zones.get(zone, _NO_ZONE).quota
        if family in own:
            return getattr(own[family], tier)
        default = self.default_quota.get(family) if zone in self.zones else None
        return getattr(default, tier) if default else None

    def quota_limit(self, zone: str, family: str, tier: Tier) -> int | None:
        """The chips the zone itself allows; None: no limit of its own (unlimited, or its region's quota alone
        bounds it: `region_quota_limit`). A zone with no entry whose region has no quota either: 0."""
        own = self.zone_quota_chips(zone, family, tier)
        if own is None:
            covered = zone in self.zones and self.region_quota_chips(zone_region(zone), family, tier) is not None
            return None if covered else 0
        return None if own == UNLIMITED else own

    def region_quota_chips(self, region: str, family: str, tier: Tier) -> int | None:
        """The region's shared chips as the region ID reports them (UNLIMITED included); None: no entry."""
        quota = self.region_quota.get(region, {}).get(family)
        return getattr(quota, tier) if quota else None

    def region_quota_limit(self, region: str, family: str, tier: Tier) -> int | None:
        """The chips every zone of the region together allows; None: no region limit (no entry, or unlimited)."""
        chips = self.region_quota_chips(region, family, tier)
        return None if chips is None or chips == UNLIMITED else chips

    def stockout_at(
        self, zone: str, family: str, t: float, overrides: dict[tuple[str, str | None], Stockout | None] | None = None
    ) -> Stockout | None:
        """The stockout in force for (zone, family) at time t, if any.

        Overrides from the control API win: key (zone, family or None for every
        family), value a Stockout, or None for "capacity available".
        """
        overrides = overrides or {}
        for key in ((zone, family), (zone, None)):
            if key in overrides:
                return overrides[key]
        for window in self.zones.get(zone, _NO_ZONE).stockouts:
            if (window.family is None or window.family == family) and window.contains(t):
                return window
        generated = self._stockout_generator(zone, family)
        if generated is None:
            return None
        windows, model, made = generated
        i = windows.index_at(t)
        if i is None:
            return None
        while len(made) <= i:
            start, end = windows.starts[len(made)], windows.ends[len(made)]
            made.append(Stockout.model_construct(start=start, end=end, family=family, effect=model.effect))
        return made[i]

    def _stockout_generator(self, zone: str, family: str):
        model = self.zones.get(zone, _NO_ZONE).stockout_model.get(family)
        if model is None or model.fraction == 0:
            return None
        key = (self.seed, zone, family)
        entry = self._generated.get(key)
        if entry is not None and entry[1] is not model:
            # A model_copy with other zones shares its original's memo (pydantic copies private attributes
            # shallowly): give this copy its own.
            self._generated = {}
            entry = None
        if entry is None:
            entry = (AlternatingWindows(keyed_rng(self.seed, "stockout", zone, family), model.fraction,
                                        model.mean_window), model, [])
            self._generated[key] = entry
        return entry

    def waiting_delay(self, zone: str, family: str, qr_name: str) -> float:
        """WAITING_FOR_RESOURCES -> capacity check for that queued resource (full name), drawn from its own RNG."""
        dist = self.zones.get(zone, _NO_ZONE).waiting.get(family, self.delays.waiting)
        return dist.value if dist.dist == "fixed" else sample(dist, keyed_uniforms(self.seed, "waiting", qr_name))

    def provisioning_delay(self, zone: str, family: str, qr_name: str) -> float:
        """PROVISIONING -> ACTIVE for that queued resource (full name), drawn from its own RNG."""
        dist = self.zones.get(zone, _NO_ZONE).provisioning.get(family, self.delays.provisioning)
        return dist.value if dist.dist == "fixed" else sample(dist, keyed_uniforms(self.seed, "provisioning", qr_name))

    def spot_lifetime(self, zone: str, family: str, node_name: str, incarnation: int = 0) -> float | None:
        """Seconds from ACTIVE to preemption of that spot node (full name; `incarnation` counts earlier times a
        node of that name was READY), or None when the scenario gives no mean lifetime there."""
        mean = self.preemption.mean_lifetime(zone, family)
        if mean is None:
            return None
        return exponential(mean, keyed_uniforms(self.seed, "preemption", node_name, incarnation)[0])

    def failure_at(self, zone: str, family: str, t: float) -> ScriptedFailure | None:
        """The scripted failure in force for (zone, family) at time t, if any."""
        for window in self.zones.get(zone, _NO_ZONE).failures:
            if (window.family is None or window.family == family) and window.contains(t):
                return window
        return None

    def external_ip_limit(self, region: str) -> int | None:
        return self.network.external_ip_quota.get(region)

    def billing_disabled_at(self, t: float) -> bool:
        return self.billing.disabled or any(w.contains(t) for w in self.billing.disabled_windows)


def stockout_windows(scenario: Scenario, zone: str, family: str, until: float, *,
                     scripted: bool = True) -> list[Stockout]:
    """The stockout windows of (zone, family) that start before `until`, by start time: the stockout_model's,
    drawn from (seed, zone, family) alone, and (unless scripted=False) the scripted ones of that family or of
    every family. The capacity model consults the same ones (a scripted window first where they overlap);
    the control API's overrides belong to a running fake, not to the scenario, and are not here."""
    out = []
    if scripted:
        out = [w for w in scenario.zones.get(zone, _NO_ZONE).stockouts
               if (w.family is None or w.family == family) and w.start < until]
    generated = scenario._stockout_generator(zone, family)
    if generated is not None:
        windows, model, _ = generated
        out += [Stockout.model_construct(start=start, end=end, family=family, effect=model.effect)
                for start, end in windows.upto(until)]
    return sorted(out, key=lambda w: w.start)


def parse_scenario(data: object, source: str = "scenario") -> Scenario:
    if data is None:
        data = {}
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors(include_url=False):
            where = ".".join(str(p) for p in e.get("loc", ())) or "(top level)"
            problems.append(f"  {where}: {e.get('msg', 'invalid')}")
        raise ScenarioError(f"invalid {source}:\n" + "\n".join(problems)) from None


DEFAULT_SCENARIO_PATH = Path(__file__).parent / "scenarios" / "default.yaml"


def load_scenario(path: str | Path | None) -> Scenario:
    """Load and validate a scenario file; None loads the packaged default (a TRC-like project)."""
    if path is None:
        path = DEFAULT_SCENARIO_PATH
    text = Path(path).read_text()
    try:
        data = yamltext.load(text)
    except yaml.YAMLError as err:
        raise ScenarioError(f"invalid scenario {path}: not YAML: {err}") from None
    return parse_scenario(data, source=f"scenario {path}")
