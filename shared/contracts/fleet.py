"""The fleet file: which TPUs tpuq may claim, where, and under which budgets.

It covers what tpu-runner's deployment.yaml holds (name, project,
idle_timeout_seconds, ssh_transport, worker_secrets, tpus[...]) and adds
per-entry spot/on-demand, several zones per entry, per-zone quota, retry
budgets, claim policy and the owner prefix that marks what tpuq created.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import date
from enum import Enum
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, field_validator, model_validator

from tpuq.contracts.jobspec import StrictModel, split_gs_uri
from tpuq.contracts.notify import NotifyList
from tpuq.contracts.tputypes import (AcceleratorType, ProvisioningModel, UnknownAcceleratorType, families, family, family_named,
                                     parse_accelerator_type, zone_region)

# id(fleet file) -> (the fleet file, its `version`): the content hash, computed once per (frozen) object
_VERSIONS: dict[int, tuple[Any, str]] = {}
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,29}$")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
_NETWORK_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")  # Compute Engine resource names and TPU node ids (RFC 1035)
_SECRET_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_FIRESTORE_LOCATION_RE = re.compile(r"^[a-z][a-z0-9-]{1,40}[0-9]$")  # nam5, eur3, us-central1
# The login user the claimer names in `ssh-keys` and the executor logs in as. Google's guest agent creates each
# `user:` of ssh-keys with `useradd -m -s /bin/bash -p * {user}` (GoogleCloudPlatform/guest-agent,
# google_guest_agent/accounts_unix.go) after refusing only empty names, whitespace, a leading '-', '/', . and ..
# (utils/ssh.go ValidateUser), so useradd decides: shadow-utils' portable rule, `[a-z_][a-z0-9_-]*[$]?` and at
# most 32 characters, utmp's limit (libmisc/chkname.c, is_valid_user_name). The trailing '$' (Samba machine
# accounts, a non-POSIX extension) is left out: no login user needs it.
POSIX_USER_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


_MODEL_ALIASES = {
    "spot": "spot",
    "preemptible": "spot",
    "on_demand": "on_demand",
    "on-demand": "on_demand",
    "ondemand": "on_demand",
    "guaranteed": "on_demand",
    "standard": "on_demand",
}


def _provisioning_alias(value: Any) -> Any:
    if isinstance(value, str):
        return _MODEL_ALIASES.get(value.strip().lower().replace(" ", "_"), value)
    return value


def _zones_from_zone(value: Any) -> Any:
    if isinstance(value, dict) and "zone" in value:
        value = dict(value)
        zone = value.pop("zone")
        value.setdefault("zones", [zone] if isinstance(zone, str) else zone)
    return value


class SshTransport(str, Enum):
    """How the executor reaches the workers' sshd (always port 22).

    - vpc: the executor runs inside the fleet's VPC (Cloud Run Direct VPC egress) and connects to each
      worker's internal IP (`networkEndpoints[].ipAddress`).
    - direct: the executor connects over the internet to each worker's external IP
      (`networkEndpoints[].accessConfig.externalIp`); every node gets external IPs.
    - iap: accepted from tpu-runner files, where it means "private-IP TPUs". tpuq opens no IAP tunnels: it
      reaches private IPs through the vpc path, and `tpuq validate` says so in one line.
    """

    vpc = "vpc"
    direct = "direct"
    iap = "iap"


# Network tags that deploy's firewall check and the claimer's node spec agree on: the executor's egress
# interface carries EXECUTOR_TAG, every node tpuq creates carries WORKER_TAG, and a rule admitting
# tcp:22 from the one to the other lets the executor in.
def executor_network_tag(owner_prefix: str) -> str:
    return f"{owner_prefix}-executor"


def worker_network_tag(owner_prefix: str) -> str:
    return f"{owner_prefix}-worker"


# The TPU VMs' service account (infra/iam.yaml creates it; the claimer puts it on every node): what the
# workers may read and write in GCS is what this account may.
WORKER_ACCOUNT_ID = "tpuq-worker"


def worker_service_account(project: str) -> str:
    return f"{WORKER_ACCOUNT_ID}@{project}.iam.gserviceaccount.com"


# A region's default external IP quota (IN_USE_ADDRESSES); a slice with external IPs takes one per host
# (production-facts.md, "External IPs"; cloud-tpu-facts.md, "Default external IP quota is 8 per region").
DEFAULT_REGION_EXTERNAL_IPS = 8


class FleetEntry(StrictModel):
    """One kind of TPU the fleet may hold: a type, its zones and its limits."""

    id: str
    type: str
    zones: list[str] = Field(min_length=1)
    runtime: str | None = None
    count: int = Field(default=1, ge=0, le=1000, description="Most slices of this entry at once")
    keep_warm_count: int = Field(default=0, ge=0)
    chip_limit: int | None = Field(default=None, ge=1)
    provisioning_model: Annotated[ProvisioningModel, BeforeValidator(_provisioning_alias)] = ProvisioningModel.spot
    existing: str | None = Field(
        default=None,
        description="The id of a TPU node tpuq did not create, in this entry's zone: tpuq runs jobs on it once it is "
        "READY and carries the executor's key, and never creates capacity for this entry, changes or deletes it")
    idle_timeout_seconds: int | None = Field(default=None, ge=0)
    single_slot: bool | None = Field(
        default=None,
        description="Claim this type one request at a time, never fanned out over zones nor raced alongside other "
        "types (the quickstart's rule for scarce models). Unset: on for "
        f"{', '.join(f.short_name for f in families() if f.single_slot)}, off otherwise",
    )

    @model_validator(mode="before")
    @classmethod
    def _zone_alias(cls, value: Any) -> Any:
        return _zones_from_zone(value)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError("must be 1-30 lowercase letters, digits or '-', starting with a letter")
        return value

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        try:
            return parse_accelerator_type(value).name
        except UnknownAcceleratorType as e:
            raise ValueError(str(e)) from None

    @field_validator("zones")
    @classmethod
    def _zones(cls, zones: list[str]) -> list[str]:
        for z in zones:
            zone_region(z)
        if len(set(zones)) != len(zones):
            raise ValueError("a zone is listed twice")
        return zones

    @field_validator("existing")
    @classmethod
    def _existing(cls, value: str | None) -> str | None:
        if value is not None and not _NETWORK_RE.match(value):
            raise ValueError(f"{value!r} is not a TPU node id (lowercase letters, digits and '-', starting with a "
                             "letter)")
        return value

    @model_validator(mode="after")
    def _limits(self) -> "FleetEntry":
        if self.existing and len(self.zones) != 1:
            raise ValueError(f"existing: {self.existing} is one node in one zone; give exactly one zone")
        if self.keep_warm_count > self.count:
            raise ValueError(f"keep_warm_count ({self.keep_warm_count}) exceeds count ({self.count})")
        if self.chip_limit is not None and self.chip_limit < self.accelerator.chips:
            raise ValueError(
                f"chip_limit ({self.chip_limit}) is below one {self.type} slice ({self.accelerator.chips} chips)"
            )
        return self

    @property
    def accelerator(self) -> AcceleratorType:
        return parse_accelerator_type(self.type)

    @property
    def runtime_version(self) -> str:
        return self.runtime or self.accelerator.default_runtime

    @property
    def spot(self) -> bool:
        return self.provisioning_model is ProvisioningModel.spot

    @property
    def is_single_slot(self) -> bool:
        """`single_slot` as written, else the family's default (`tpuq.contracts.tputypes.Family.single_slot`: v6e)."""
        if self.single_slot is not None:
            return self.single_slot
        return family(self.accelerator.family).single_slot

    @property
    def max_slices(self) -> int:
        """count, further capped by chip_limit."""
        if self.chip_limit is None:
            return self.count
        return min(self.count, self.chip_limit // self.accelerator.chips)


class TierQuota(StrictModel):
    """Declared chips of one family in one zone, per tier. A tier left out is not declared (the claimer asks the
    Cloud Quotas API); a declared value overrides the API's."""

    spot: int | None = Field(default=None, ge=0, description="Spot (preemptible) chips")
    on_demand: int | None = Field(default=None, ge=0, description="On-demand chips")

    def declared(self, model: ProvisioningModel) -> int | None:
        return self.spot if model is ProvisioningModel.spot else self.on_demand

    def chips(self, model: ProvisioningModel) -> int:
        return self.declared(model) or 0


class RetryBudgets(StrictModel):
    preemptions: int = Field(default=20, ge=0, description="Retries after spot preemptions")
    infra_failures: int = Field(default=2, ge=0, description="Retries after infrastructure failures")
    backoff_base_seconds: float = Field(default=5.0, ge=0)
    backoff_max_seconds: float = Field(default=300.0, ge=0)


class ClaimPolicy(StrictModel):
    valid_until_seconds: int = Field(default=12 * 3600, ge=60, description="Queued requests expire after this")
    unknown_error_retries: int = Field(
        default=1, ge=0, le=20,
        description="Retries (each after a capacity-style back-off) of a zone and type after an unknown error or an "
        "external IP quota error; then that target is stopped for unknown_error_backoff_seconds")
    unknown_error_backoff_seconds: float = Field(
        default=3600.0, ge=0, le=7 * 86400,
        description="How long a target stays stopped once its unknown-error retries are spent; then it is tried again")
    capacity_backoff_base_seconds: float = Field(default=60.0, ge=0)
    capacity_backoff_max_seconds: float = Field(default=1800.0, ge=0)
    hedge_seconds: float = Field(
        default=0.0, ge=0, le=86400,
        description="0: a request races every zone that can take it at once. Above 0: it starts in as many zones "
        "as it asks slices (in the fleet's zone order) and adds one more zone each time its newest racer has waited "
        "this long without the capacity it asks: fewer slices provisioned for nothing, a later start when the first "
        "zone is out")
    watch_interval_seconds: float = Field(default=5.0, gt=0, description="Fast watch after a create")
    orphan_grace_seconds: float = Field(default=600.0, ge=0)


class Budget(StrictModel):
    """How many VM-hours the fleet may use a day. A VM-hour is one TPU VM host for one hour (a v4-32 slice has 4
    hosts: 4 VM-hours an hour), the unit a TRC user's cost is counted in. The day is the UTC day."""

    vm_hours_per_day: float = Field(gt=0, description="Claiming stops for the (UTC) day once the day's use plus "
                                    "one more hour of every slice alive, the new one included, would pass this")


class FleetFile(StrictModel):
    name: str
    project: str
    owner_prefix: str = "tpuq"
    idle_timeout_seconds: int = Field(default=600, ge=0)
    ssh_transport: SshTransport = SshTransport.vpc
    network: str = Field(default="default", description="VPC network of the TPU nodes and the executor's egress")
    subnetwork: str = Field(
        default="default",
        description="Subnet of the TPU nodes, by name. Subnets are regional: a subnet of this name must exist in "
        "every region of the fleet's zones (and, under vpc/iap, in the services' region, where deploy gives the "
        "executor an interface on it); `tpuq deploy` checks each (tpuq.capacity.subnets)",
    )
    worker_external_ips: bool | None = Field(
        default=None,
        description="Whether slices under 16 hosts get external IPs (so workers reach PyPI without Cloud NAT). "
        "Unset: yes under vpc, no under iap (private IPs are what iap asks for). false: no node gets one (the "
        "project has NAT). direct always gives every node external IPs",
    )
    ssh_user: str = Field(
        default="tpuq",
        description="The user the executor logs in as on every worker: the claimer puts the executor's key under "
        "this name in each node's ssh-keys metadata, where the guest agent creates the user. A POSIX user name: "
        "lowercase letters, digits, '_' and '-', starting with a letter or '_', at most 32 characters; not root",
    )
    ssh_key_secret: str | None = Field(default=None, description="Secret Manager name of the executor's SSH key")
    worker_secrets: list[str] = Field(default_factory=list, description="Secret Manager names, never values")
    runner_bucket: str | None = None
    firestore_location: str | None = Field(
        default=None,
        description="Location of the Firestore database deploy creates (a multi-region like nam5 or eur3, or a "
        "region); deploy's --firestore-location overrides it; neither: the services' --region",
    )
    job_buckets: list[str] = Field(
        default_factory=list,
        description="gs:// buckets jobs list under `buckets:`; deploy lets the workers' account read bundles from "
        "and write logs to them (roles/storage.objectAdmin on each bucket)",
    )
    notify: NotifyList = Field(
        default_factory=list, description="Destinations told of every job's events and of the fleet's own (blocked, "
        "budget, grant_end, leaked): Secret Manager secrets holding webhook URLs (tpuq.contracts.notify)",
    )
    retry: RetryBudgets = Field(default_factory=RetryBudgets)
    claim: ClaimPolicy = Field(default_factory=ClaimPolicy)
    quota: dict[str, dict[str, TierQuota]] | None = Field(
        default=None,
        description="zone -> TPU family (v4, v5e, v6e...) -> {spot, on_demand} chips: an optional override of the "
        "Cloud Quotas API's per-zone quota; a declared value wins, anything not declared is read from the API",
    )
    tpus: list[FleetEntry] = Field(min_length=1)
    budget: Budget | None = Field(default=None, description="A daily VM-hour cap on claiming (absent: none)")
    grant_expires: date | None = Field(
        default=None, description="The last day (UTC) of the grant, YYYY-MM-DD: nothing is claimed after it")

    @field_validator("grant_expires", mode="before")
    @classmethod
    def _grant_date(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return date.fromisoformat(value.strip())
            except ValueError:
                raise ValueError(f"{value!r} is not a date like 2026-12-31") from None
        if value is not None and not isinstance(value, date):
            raise ValueError(f"{value!r} is not a date like 2026-12-31")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError("must be 1-30 lowercase letters, digits or '-', starting with a letter")
        return value

    @field_validator("owner_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not _PREFIX_RE.match(value):
            raise ValueError("must be 1-20 lowercase letters, digits or '-', starting with a letter")
        return value

    @field_validator("ssh_user")
    @classmethod
    def _ssh_user(cls, value: str) -> str:
        if not POSIX_USER_NAME_RE.match(value):
            raise ValueError(f"{value!r} is not a user name the TPU VM's guest agent can create: 1-32 lowercase "
                             "letters, digits, '_' or '-', starting with a letter or '_' (useradd's portable rule)")
        if value == "root":
            # The guest agent gives every user it creates passwordless sudo (group google-sudoers), so an ordinary
            # user can do anything root can, and the job's files stay out of root's home.
            raise ValueError("'root' is refused: name an ordinary user (the guest agent gives it passwordless sudo)")
        return value

    @field_validator("network", "subnetwork")
    @classmethod
    def _network_name(cls, value: str) -> str:
        # Shared VPC (a network in a host project) would need every read, check and command of deploy to name
        # the host project; until then only the fleet project's own networks are accepted, by name.
        if not _NETWORK_RE.match(value):
            raise ValueError(f"{value!r} must be the name of a network or subnet in the fleet's project (lowercase "
                             "letters, digits and '-'); Shared VPC networks of another project are not supported")
        return value

    @field_validator("firestore_location")
    @classmethod
    def _firestore_location(cls, value: str | None) -> str | None:
        if value is not None and not _FIRESTORE_LOCATION_RE.match(value):
            raise ValueError(f"{value!r} is not a Firestore location (e.g. nam5, eur3, us-central1)")
        return value

    @field_validator("worker_secrets")
    @classmethod
    def _secret_names(cls, names: list[str]) -> list[str]:
        for n in names:
            if not _SECRET_RE.match(n):
                raise ValueError(f"{n!r} is not a Secret Manager secret name (give names, never values)")
        return names

    @field_validator("runner_bucket")
    @classmethod
    def _runner_bucket(cls, value: str | None) -> str | None:
        if value is not None:
            bucket, path = split_gs_uri(value)
            if path.strip("/"):
                raise ValueError(f"{value!r} must be a bucket URI like gs://my-bucket")
            return f"gs://{bucket}"
        return value

    @field_validator("job_buckets")
    @classmethod
    def _job_buckets(cls, values: list[str]) -> list[str]:
        out = []
        for value in values:
            bucket, path = split_gs_uri(value if value.startswith("gs://") else f"gs://{value}")
            if path.strip("/"):
                raise ValueError(f"{value!r} must be a bucket URI like gs://my-bucket")
            if f"gs://{bucket}" in out:
                raise ValueError(f"gs://{bucket} is listed twice")
            out.append(f"gs://{bucket}")
        return out

    @property
    def job_bucket_names(self) -> list[str]:
        return [b.removeprefix("gs://") for b in self.job_buckets]

    @field_validator("quota")
    @classmethod
    def _quota_keys(cls, quota: dict[str, dict[str, TierQuota]] | None) -> dict[str, dict[str, TierQuota]] | None:
        if quota is None:
            return None
        out: dict[str, dict[str, TierQuota]] = {}
        for zone, by_family in quota.items():
            zone_region(zone)
            out[zone] = {}
            for name, q in by_family.items():
                row = family_named(name)
                if row is None:
                    known = ", ".join(f.short_name for f in families())
                    raise ValueError(f"{zone}.{name}: unknown TPU family (expected {known})")
                out[zone][row.name] = q
        return out

    @model_validator(mode="after")
    def _unique_ids(self) -> "FleetFile":
        ids = [t.id for t in self.tpus]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"tpus: id {dupes[0]!r} is used twice")
        return self

    @property
    def reaches_internal_ips(self) -> bool:
        """True when the executor connects to internal IPs (vpc, and iap which tpuq serves the same way)."""
        return self.ssh_transport is not SshTransport.direct

    def external_ips_for(self, accel: AcceleratorType) -> bool:
        """Whether nodes of this type get external IPs (`networkConfig.enableExternalIps`).

        direct needs them on every host. Otherwise the quickstart's rule: under 16 hosts keep them (workers
        reach PyPI without NAT); 16+ hosts get internal IPs only; worker_external_ips=false turns them off."""
        if self.ssh_transport is SshTransport.direct:
            return True
        wanted = self.worker_external_ips
        if wanted is None:
            wanted = self.ssh_transport is not SshTransport.iap
        return wanted and not accel.needs_internal_ips

    def transport_notes(self) -> list[str]:
        """Warnings `tpuq validate` prints: settings that are valid but may not do what the user expects."""
        notes: list[str] = []
        if self.ssh_transport is SshTransport.iap:
            external = " (worker_external_ips: true keeps external IPs on slices under 16 hosts)" \
                if self.worker_external_ips else "; workers reach PyPI through Cloud NAT, which deploy checks"
            notes.append(
                "ssh_transport: iap: tpuq opens no IAP tunnels; nodes get internal IPs only and the executor "
                f"reaches them over the VPC (Direct VPC egress), as with ssh_transport: vpc{external}")
        if self.ssh_transport is SshTransport.direct and self.worker_external_ips is False:
            notes.append("worker_external_ips: false has no effect with ssh_transport: direct, which reaches every "
                         "node at its external IP; use ssh_transport: vpc for nodes without external IPs")
        if self.ssh_transport is SshTransport.direct:
            for region, total, parts in self.external_ips_by_region():
                if total > DEFAULT_REGION_EXTERNAL_IPS:
                    notes.append(
                        f"region {region}: the fleet may hold {total} external IPs there at once ({', '.join(parts)}; "
                        f"ssh_transport: direct gives every host one), above a region's default quota of "
                        f"{DEFAULT_REGION_EXTERNAL_IPS} (IN_USE_ADDRESSES); ssh_transport: vpc reaches internal IPs "
                        "instead, or ask for more quota")
        return notes

    def external_ips_by_region(self) -> list[tuple[str, int, list[str]]]:
        """(region, external IPs, what holds them) for every region the fleet may hold nodes with external IPs in:
        each entry counts its most slices at once (an existing node: one) times the hosts of one, in every region
        among its zones, since its slices may all land in any one of them."""
        out: dict[str, tuple[int, list[str]]] = {}
        for t in self.tpus:
            accel = t.accelerator
            slices = 1 if t.existing else t.max_slices
            if not slices or not self.external_ips_for(accel):
                continue
            for region in dict.fromkeys(zone_region(z) for z in t.zones):
                total, parts = out.get(region, (0, []))
                held = f"tpus[{t.id}] {t.type}: {slices} x {accel.hosts} hosts"
                out[region] = (total + slices * accel.hosts, [*parts, held])
        return [(region, total, parts) for region, (total, parts) in out.items()]

    @property
    def node_regions(self) -> list[str]:
        """The regions tpuq creates TPU nodes in (every zone of every entry but `existing` ones), in fleet order:
        each needs a subnet named `subnetwork` (tpuq.capacity.subnets)."""
        return list(dict.fromkeys(zone_region(z) for t in self.tpus if not t.existing for z in t.zones))

    def entry(self, entry_id: str) -> FleetEntry | None:
        return next((t for t in self.tpus if t.id == entry_id), None)

    def zone_quota_chips(self, zone: str, family: str, model: ProvisioningModel) -> int | None:
        """Declared chips for (zone, family, tier); None when the fleet declares no quota at all."""
        if self.quota is None:
            return None
        q = self.quota.get(zone, {}).get(family)
        return q.chips(model) if q else 0

    def declared_quota_chips(self, zone: str, family: str, model: ProvisioningModel) -> int | None:
        """The chips the fleet file declares for (zone, family, tier), or None where it declares nothing."""
        q = (self.quota or {}).get(zone, {}).get(family)
        return q.declared(model) if q else None

    def idle_timeout_for(self, entry_id: str | None) -> int:
        entry = self.entry(entry_id) if entry_id else None
        if entry and entry.idle_timeout_seconds is not None:
            return entry.idle_timeout_seconds
        return self.idle_timeout_seconds

    @property
    def version(self) -> str:
        """A content hash: decisions tied to one fleet file (dropped zones) reset when it changes. A handler asks
        for it again and again: kept per object (frozen; a copy with changes is another object)."""
        kept = _VERSIONS.get(id(self))
        if kept is not None and kept[0] is self:
            return kept[1]
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        version = hashlib.sha256(blob).hexdigest()[:16]
        if len(_VERSIONS) >= 256:
            _VERSIONS.clear()
        _VERSIONS[id(self)] = (self, version)  # the object is held, so its id is not another's meanwhile
        return version

