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
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tpuq.documents import MaintenanceType, SymptomType, TpuHealth
from tpuq.tputypes import _FAMILIES, zone_region

from .errors import ERROR_CLASSES

FAMILIES = tuple(_FAMILIES)
Tier = Literal["spot", "on_demand"]


class ScenarioError(ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_family(value: str | None) -> str | None:
    if value is not None and value not in FAMILIES:
        raise ValueError(f"unknown accelerator family {value!r}; expected one of {', '.join(FAMILIES)}")
    return value


class FamilyQuota(_Strict):
    """Chips of one accelerator family a project may hold in one zone; absent = 0."""

    spot: int = Field(0, ge=0)
    on_demand: int = Field(0, ge=0)


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


class ZoneScenario(_Strict):
    quota: dict[str, FamilyQuota] = Field(default_factory=dict)
    stockouts: list[Stockout] = Field(default_factory=list)
    failures: list[ScriptedFailure] = Field(default_factory=list)

    _families = field_validator("quota")(lambda value: _check_families(value))


def _check_families(value: dict[str, FamilyQuota]) -> dict[str, FamilyQuota]:
    for family in value:
        _check_family(family)
    return value


class Delays(_Strict):
    """Scenario seconds spent in each state on the normal path."""

    accepted: float = Field(1, ge=0)  # ACCEPTED -> WAITING_FOR_RESOURCES (quota check here)
    waiting: float = Field(5, ge=0)  # WAITING_FOR_RESOURCES -> PROVISIONING (capacity check here)
    provisioning: float = Field(600, ge=0)  # PROVISIONING -> ACTIVE
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


class Preemption(_Strict):
    mean_spot_lifetime: float | None = Field(None, gt=0)  # exponential, from the seeded RNG
    scripted: list[ScriptedPreemption] = Field(default_factory=list)


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
    cloud_quotas: CloudQuotas = Field(default_factory=CloudQuotas)
    delays: Delays = Field(default_factory=Delays)
    preemption: Preemption = Field(default_factory=Preemption)
    health: NodeHealthScenario = Field(default_factory=NodeHealthScenario)
    billing: Billing = Field(default_factory=Billing)
    network: Network = Field(default_factory=Network)

    @field_validator("zones")
    @classmethod
    def _zone_names(cls, value: dict[str, ZoneScenario]) -> dict[str, ZoneScenario]:
        for zone in value:
            zone_region(zone)  # raises ValueError with a clear message
            if not re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", zone):
                raise ValueError(f"not a zone name: {zone!r} (expected e.g. us-central2-b)")
        return value

    _default_families = field_validator("default_quota")(lambda value: _check_families(value))

    # -- evaluation ----------------------------------------------------------

    def has_zone(self, zone: str) -> bool:
        return zone in self.zones

    def quota_limit(self, zone: str, family: str, tier: Tier) -> int:
        """Chips; the zone's own entry for the family, else the default entry (scenario zones only), else 0."""
        own = self.zones.get(zone, ZoneScenario()).quota
        if family in own:
            return getattr(own[family], tier)
        default = self.default_quota.get(family) if zone in self.zones else None
        return getattr(default, tier) if default else 0

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
        for window in self.zones.get(zone, ZoneScenario()).stockouts:
            if (window.family is None or window.family == family) and window.contains(t):
                return window
        return None

    def failure_at(self, zone: str, family: str, t: float) -> ScriptedFailure | None:
        """The scripted failure in force for (zone, family) at time t, if any."""
        for window in self.zones.get(zone, ZoneScenario()).failures:
            if (window.family is None or window.family == family) and window.contains(t):
                return window
        return None

    def external_ip_limit(self, region: str) -> int | None:
        return self.network.external_ip_quota.get(region)

    def billing_disabled_at(self, t: float) -> bool:
        return self.billing.disabled or any(w.contains(t) for w in self.billing.disabled_windows)


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
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ScenarioError(f"invalid scenario {path}: not YAML: {err}") from None
    return parse_scenario(data, source=f"scenario {path}")
