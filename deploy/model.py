"""What deploy plans with: the target, the project's current state, and the actions (tpuq.deploy.plan makes
them; tpuq.deploy.network, job_buckets and generated_secrets add theirs; tpuq.deploy.gcp applies them).
Plain data, no I/O; one module below all of deploy's planners, so none of them imports another's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpuq.deploy.infra import Infra
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.ownership import owner_labels


# ------------------------------------------------------------- the target
@dataclass(frozen=True)
class Target:
    """Where to deploy: the fleet file plus what only the command line says."""

    fleet: FleetFile
    region: str = "us-central1"
    firestore_location: str | None = None  # --firestore-location; default: the fleet's, else region
    image_tag: str = "latest"
    project_number: str | None = None  # from the project; None in an offline plan
    service_urls: dict[str, str] | None = None  # override Cloud Run's deterministic URLs (tests)

    @property
    def project(self) -> str:
        return self.fleet.project

    @property
    def runner_bucket(self) -> str:
        if self.fleet.runner_bucket:
            return self.fleet.runner_bucket.removeprefix("gs://")
        return f"{self.project}-tpuq-runner"

    def variables(self) -> dict[str, Any]:
        return {"project": self.project, "region": self.region,
                "firestore_location": self.firestore_location or self.fleet.firestore_location or self.region, "image_tag": self.image_tag,
                "service": "${service}",  # expanded per service
                "ssh_key_secret": self.fleet.ssh_key_secret, "worker_secrets": list(self.fleet.worker_secrets),
                "notify_secrets": self.notify_secrets, "job_buckets": self.fleet.job_bucket_names}

    @property
    def notify_secrets(self) -> list[str]:
        """The secrets of the fleet's `notify:` in this project (the janitor reads them: tpuq.janitor.notify); one of
        another project is granted there, by its owner."""
        own = f"projects/{self.project}/secrets/"
        names = [d.secret.removeprefix(own) for d in self.fleet.notify if d.secret]
        return list(dict.fromkeys(n for n in names if "/" not in n))

    def sa_email(self, account_id: str) -> str:
        return f"{account_id}@{self.project}.iam.gserviceaccount.com"

    def member(self, spec: str) -> str:
        kind, _, name = spec.partition(":")
        number = self.project_number or "<project-number>"
        if kind == "sa":
            return f"serviceAccount:{self.sa_email(name)}"
        if kind == "agent" and name == "pubsub":
            return f"serviceAccount:service-{number}@gcp-sa-pubsub.iam.gserviceaccount.com"
        if kind == "agent" and name == "storage":
            return f"serviceAccount:service-{number}@gs-project-accounts.iam.gserviceaccount.com"
        raise ValueError(f"unknown member {spec!r} in infra/iam.yaml")

    @property
    def labels(self) -> dict[str, str]:
        """On everything deploy creates that takes labels: `tpuq undeploy` removes only what carries them."""
        return owner_labels(self.fleet)

    @property
    def marker(self) -> str:
        """The description of what deploy creates that takes no labels (service accounts, the scheduler job)."""
        return f"created by tpuq deploy for fleet {self.fleet.name} (owner {self.fleet.owner_prefix})"

    def agent_email(self, name: str) -> str:
        return self.member(f"agent:{name}").removeprefix("serviceAccount:")

    def service_url(self, infra: Infra, service: str) -> str:
        if self.service_urls and service in self.service_urls:
            return self.service_urls[service].rstrip("/")
        run_name = infra.services.service(service).run_service
        # Cloud Run's deterministic URL: known before the service exists, so the plan stays pure.
        return f"https://{run_name}-{self.project_number or '<project-number>'}.{self.region}.run.app"


# ---------------------------------------------------------- current state
@dataclass
class NetworkFacts:
    private_google_access: bool | None = None  # None: could not be read
    cloud_nat: bool | None = None


@dataclass
class VpcFacts:
    """What decides whether the executor reaches the workers (tpuq.deploy.network); None: could not be read."""

    subnet: dict | None = None  # the executor's subnet in the services' region (compute v1 Subnetwork)
    subnet_missing: bool = False  # read, and not there
    # The fleet's subnet in each region it creates TPU nodes in (tpuq.capacity.subnets): the Subnetwork, or None when read
    # and not there; a region left out could not be read.
    region_subnets: dict[str, dict | None] = field(default_factory=dict)
    firewalls: list[dict] | None = None  # compute v1 Firewall resources of the project
    project_metadata: dict[str, str] | None = None  # commonInstanceMetadata, key -> value
    require_os_login: bool | None = None  # org policy constraints/compute.requireOsLogin enforced
    external_ips_forbidden: bool | None = None  # org policy constraints/compute.vmExternalIpAccess denies them


@dataclass
class ProjectState:
    """What the project holds now. A fresh ProjectState is an empty project (or an offline plan)."""

    known: bool = False
    project_number: str | None = None
    enabled_apis: set[str] = field(default_factory=set)
    service_accounts: set[str] = field(default_factory=set)  # emails
    iam: dict[str, set[tuple[str, str]]] = field(default_factory=dict)  # resource key -> {(role, member)}
    topics: set[str] = field(default_factory=set)
    subscriptions: dict[str, dict] = field(default_factory=dict)  # short name -> REST resource
    buckets: dict[str, dict] = field(default_factory=dict)
    notifications: dict[str, list[dict]] = field(default_factory=dict)  # bucket -> configs
    artifact_repositories: set[str] = field(default_factory=set)
    run_services: dict[str, dict] = field(default_factory=dict)  # Cloud Run name -> REST resource
    scheduler_jobs: dict[str, dict] = field(default_factory=dict)
    firestore_databases: set[str] = field(default_factory=set)
    firestore_indexes: list[dict] = field(default_factory=list)
    secrets: set[str] | None = None  # None: unknown
    stored_fleet_version: str | None = None
    networks: dict[str, NetworkFacts] = field(default_factory=dict)  # region -> facts
    vpc: VpcFacts = field(default_factory=VpcFacts)
    missing_buckets: set[str] = field(default_factory=set)  # the fleet's job_buckets read and not found
    # The fleet's job_buckets whose IAM policy deploy may not read (403: another project's bucket): granted by their
    # owner, from a todo (tpuq.deploy.job_buckets)
    unreadable_job_buckets: set[str] = field(default_factory=set)
    # Secrets deploy makes (tpuq.deploy.generated_secrets) that exist with no enabled version: one is added
    versionless_secrets: set[str] = field(default_factory=set)
    cloud_build_account: str | None = None  # who builds that name no account run as (None: not read)
    billing_enabled: bool | None = None  # Cloud Billing's billingEnabled (None: not read)
    # The REST resources behind some of the sets above: their labels and descriptions say what deploy created.
    topic_resources: dict[str, dict] = field(default_factory=dict)
    service_account_resources: dict[str, dict] = field(default_factory=dict)  # email -> resource
    artifact_repository_resources: dict[str, dict] = field(default_factory=dict)
    bucket_objects: dict[str, list[str]] = field(default_factory=dict)  # read only for `tpuq undeploy --purge`


# ----------------------------------------------------------------- actions
@dataclass(frozen=True)
class Request:
    api: str  # the adapter's key: pubsub, iam, run, ...
    method: str
    path: str  # relative to the API's versioned base URL
    params: dict | None = None
    body: Any = None


@dataclass(frozen=True)
class IamResource:
    key: str  # "project", "topic:gcs-events", ...
    label: str
    api: str
    get: Request
    set_method: str
    set_path: str
    wrap_policy: bool = True  # {"policy": ...} (every API but Cloud Storage's)


@dataclass(frozen=True)
class Action:
    verb: str  # enable | ensure | create | update | grant | store | check | todo (undeploy: delete | revoke | keep)
    what: str
    detail: str = ""
    request: Request | None = None
    iam: IamResource | None = None
    role: str | None = None
    member: str | None = None
    commands: tuple[str, ...] = ()  # todo: commands for a person to run

    def __str__(self) -> str:
        line = f"{self.verb} {self.what}" + (f" {self.detail}" if self.detail else "")
        return line + "".join(f"\n      {c}" for c in self.commands)

    @property
    def sends(self) -> bool:
        return self.request is not None or self.iam is not None
