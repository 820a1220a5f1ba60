"""infra/: the whole cloud footprint as reviewable YAML files, loaded and checked here.

- infra/apis.yaml        APIs to enable
- infra/pubsub.yaml      topics and push subscriptions: GENERATED from tpuq.contracts.topology
                         (`python -m tpuq.deploy.infra --write`); loading refuses a file that drifted
- infra/iam.yaml         service accounts and every role binding
- infra/storage.yaml     the runner bucket, its lifecycle rules and notifications
- infra/services.yaml    the Cloud Run services
- infra/scheduler.yaml   the Cloud Scheduler tick
- infra/firestore.yaml   the database; its indexes are infra/firestore.indexes.json

Strings may say `${project}`, `${region}`, `${firestore_location}`, `${image_tag}`, `${service}`,
`${ssh_key_secret}`, `${worker_secrets}`, `${notify_secrets}` or `${job_buckets}`. An item that names a variable the fleet leaves unset is
dropped; an item that names a list variable is repeated once per element.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from tpuq.contracts import topology, yamltext
from tpuq.contracts.jobspec import StrictModel

# infra/ is package data: pyproject.toml installs the top-level infra/ directory as the package `tpuq._infra`, so an
# installed tpuq (a wheel, pipx, `uv tool`, Cloud Build's `pip install .`) reads the same files as a checkout does.
INFRA_DIR = Path(str(resources.files("tpuq._infra")))
PUSH_SERVICE_ACCOUNT = "tpuq-push"
DEPLOY_SERVICE_ACCOUNT = "tpuq-deploy"  # cloudbuild.yaml's serviceAccount; its roles are in infra/iam.yaml
_VAR_RE = re.compile(r"\$\{([a-z_]+)\}")


class InfraError(ValueError):
    """infra/ is malformed or disagrees with tpuq.contracts.topology; the message says which file and what."""


# ---------------------------------------------------------------- models
class TopicSpec(StrictModel):
    name: str
    description: str = ""


class SubscriptionSpec(StrictModel):
    """The fields of tpuq.contracts.topology.Subscription, so that the same REST body builder serves both."""

    name: str
    topic: str
    service: str
    path: str
    ack_deadline_seconds: int
    max_delivery_attempts: int
    min_backoff_seconds: int
    max_backoff_seconds: int
    filter: str = ""

    def as_topology(self) -> topology.Subscription:
        return topology.Subscription(**self.model_dump())


class HoldSubscriptionSpec(StrictModel):
    """A pull subscription that only keeps messages for people to inspect (a topic alone keeps nothing)."""

    name: str
    topic: str
    message_retention_seconds: int = Field(ge=600, le=604800)


class PubsubInfra(StrictModel):
    push_service_account: str
    dead_letter_topic: str
    topics: list[TopicSpec]
    subscriptions: list[SubscriptionSpec]
    hold_subscriptions: list[HoldSubscriptionSpec] = []


class ServiceAccountSpec(StrictModel):
    id: str
    display_name: str


class BindingSpec(StrictModel):
    member: str
    role: str
    resource: str


class IamInfra(StrictModel):
    service_accounts: list[ServiceAccountSpec]
    bindings: list[BindingSpec]

    @property
    def deploy_account(self) -> str:
        return DEPLOY_SERVICE_ACCOUNT


class LifecycleRule(StrictModel):
    action: str
    age_days: int
    matches_prefix: list[str] = []
    matches_suffix: list[str] = []


class BucketSpec(StrictModel):
    id: str
    location: str
    uniform_bucket_level_access: bool = True
    lifecycle: list[LifecycleRule] = []


class NotificationSpec(StrictModel):
    bucket: str
    topic: str
    object_name_prefix: str
    event_types: list[str]


class StorageInfra(StrictModel):
    buckets: list[BucketSpec]
    notifications: list[NotificationSpec]


class SecretFile(StrictModel):
    secret: str
    mount_dir: str
    file: str
    # Set: a secret deploy makes itself when the project has none, its first version this many random bytes made at
    # apply (tpuq.deploy.generated_secrets); unset: the user's secret, which deploy never creates or reads.
    random_bytes: int | None = Field(default=None, ge=32, le=65536)  # Secret Manager's payload limit is 64 KiB


class ServiceSpec(StrictModel):
    name: str
    run_service: str
    service_account: str
    cpu: str
    memory: str
    timeout_seconds: int | None = None  # default: the longest ack deadline of the subscriptions pushing to it
    concurrency: int
    max_instances: int
    # Kept warm: instances that never scale to zero, and CPU outside requests (Cloud Run's "CPU always
    # allocated", run v2 `cpuIdle: false`). Both are billed around the clock; the executor's SSH connections
    # outlive a request only with them (docs/DEPLOYING.md, "Keeping the executor's SSH connections between jobs").
    min_instances: int = 0
    cpu_always_allocated: bool = False
    env: dict[str, str] = {}
    secret_files: list[SecretFile] = []
    vpc_egress: bool = False  # Direct VPC egress on the fleet's network (tpuq.deploy.network), unless `direct`


class ServicesInfra(StrictModel):
    artifact_repository: str
    image: str  # with ${service} left for each service
    services: list[ServiceSpec]

    def service(self, name: str) -> ServiceSpec:
        return next(s for s in self.services if s.name == name)


class SchedulerJobSpec(StrictModel):
    name: str
    schedule: str
    time_zone: str
    topic: str
    data: dict[str, Any]


class SchedulerInfra(StrictModel):
    jobs: list[SchedulerJobSpec]


class FirestoreInfra(StrictModel):
    database: str
    type: str
    location: str
    indexes_file: str
    indexes: list[dict] = []  # read from indexes_file


class ApisInfra(StrictModel):
    apis: list[str]


@dataclass(frozen=True)
class Infra:
    apis: ApisInfra
    pubsub: PubsubInfra
    iam: IamInfra
    storage: StorageInfra
    services: ServicesInfra
    scheduler: SchedulerInfra
    firestore: FirestoreInfra

    def longest_ack_deadline(self, service: str) -> tuple[int, str]:
        """(seconds, subscription) of the subscription pushing to this service that Pub/Sub waits longest for."""
        return max(((s.ack_deadline_seconds, s.name) for s in self.pubsub.subscriptions if s.service == service),
                   default=(0, ""))

    def request_timeout_seconds(self, service: str) -> int:
        """Cloud Run's request timeout: never shorter than Pub/Sub's wait for an ack, or a push still being
        handled is cut off (504) and redelivered, and the work is done twice."""
        spec = self.services.service(service)
        return max(spec.timeout_seconds or 0, self.longest_ack_deadline(service)[0])

    def server_env(self, service: str) -> dict[str, str]:
        """How many requests the container itself serves at once: as many as Cloud Run sends it
        (`maxInstanceRequestConcurrency`, the service's `concurrency`). functions-framework's gunicorn
        (functions_framework/_http/gunicorn.py) runs WORKERS processes of THREADS threads, 1 × (4 × CPUs) by
        default: 4 on 1 vCPU, while Cloud Run sends up to 10 or 20, so the rest waited inside the container,
        their time counting against Pub/Sub's ack deadline. One process (one Python heap in the memory limit),
        `concurrency` threads. The dashboard (ui) is no functions-framework target: its werkzeug server starts a
        thread per request."""
        if service not in topology.SERVICES:
            return {}
        return {"THREADS": str(self.services.service(service).concurrency), "WORKERS": "1"}


# ------------------------------------------------------------- expansion
def _expand_str(text: str, variables: dict[str, Any]) -> str | None:
    """None when the string names a variable that is unset (the item is then dropped)."""
    missing = False

    def sub(m: re.Match) -> str:
        nonlocal missing
        name = m.group(1)
        if name not in variables:
            raise InfraError(f"unknown variable ${{{name}}} (known: {', '.join(sorted(variables))})")
        value = variables[name]
        if value is None:
            missing = True
            return ""
        return str(value)

    out = _VAR_RE.sub(sub, text)
    return None if missing else out


class _Unset(Exception):
    pass


def _expand(value: Any, variables: dict[str, Any]) -> Any:
    if isinstance(value, str):
        out = _expand_str(value, variables)
        if out is None:
            raise _Unset
        return out
    if isinstance(value, dict):
        return {k: _expand(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        items = []
        for item in value:
            items.extend(_expand_item(item, variables))
        return items
    return value


def _vars_in(value: Any) -> set[str]:
    if isinstance(value, str):
        return set(_VAR_RE.findall(value))
    if isinstance(value, dict):
        return set().union(*(_vars_in(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_vars_in(v) for v in value)) if value else set()
    return set()


def _expand_item(item: Any, variables: dict[str, Any]) -> list[Any]:
    """One list item -> zero (it names an unset variable), one, or one per element of a list variable."""
    list_vars = sorted(v for v in _vars_in(item) if isinstance(variables.get(v), (list, tuple)))
    out = []
    for combo in itertools.product(*(variables[v] for v in list_vars)):
        scoped = {**variables, **dict(zip(list_vars, combo))}
        try:
            out.append(_expand(item, scoped))
        except _Unset:
            continue
    return out


def expand(value: Any, variables: dict[str, Any]) -> Any:
    try:
        return _expand(value, variables)
    except _Unset:
        return None


# ---------------------------------------------------------------- loading
def _read_yaml(directory: Path, name: str) -> Any:
    path = directory / name
    if not path.exists():
        raise InfraError(f"{path}: missing")
    try:
        return yamltext.load(path.read_text())  # a key given twice is refused, not the last one kept
    except yaml.YAMLError as e:
        raise InfraError(f"{path}: {yamltext.error_text(e)}") from None


def _model(model, data: Any, where: str):
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise InfraError(f"{where}: {loc}: {first['msg']}") from None


def load_infra(variables: dict[str, Any], directory: Path = INFRA_DIR) -> Infra:
    """Read, expand and validate infra/, and check it against tpuq.contracts.topology."""
    raw_pubsub = _read_yaml(directory, "pubsub.yaml")
    drift = topology_drift(raw_pubsub)
    if drift:
        raise InfraError(f"{directory / 'pubsub.yaml'} disagrees with tpuq.contracts.topology ({drift[0]}): "
                         "regenerate it with `python -m tpuq.deploy.infra --write`")

    def load(model, name: str):
        return _model(model, expand(_read_yaml(directory, name), variables), str(directory / name))

    firestore = load(FirestoreInfra, "firestore.yaml")
    indexes_path = directory / firestore.indexes_file
    try:
        firestore = firestore.model_copy(update={"indexes": json.loads(indexes_path.read_text()).get("indexes", [])})
    except (OSError, ValueError) as e:
        raise InfraError(f"{indexes_path}: {e}") from None
    infra = Infra(
        apis=load(ApisInfra, "apis.yaml"),
        pubsub=_model(PubsubInfra, raw_pubsub, str(directory / "pubsub.yaml")),
        iam=load(IamInfra, "iam.yaml"),
        storage=load(StorageInfra, "storage.yaml"),
        services=load(ServicesInfra, "services.yaml"),
        scheduler=load(SchedulerInfra, "scheduler.yaml"),
        firestore=firestore,
    )
    for spec in infra.services.services:
        deadline, subscription = infra.longest_ack_deadline(spec.name)
        if spec.timeout_seconds is not None and spec.timeout_seconds < deadline:
            raise InfraError(f"{directory / 'services.yaml'}: {spec.name}.timeout_seconds: {spec.timeout_seconds} is "
                             f"below the {deadline} s ack deadline of {subscription}: Cloud Run would cut off a push "
                             "that Pub/Sub still waits for (leave it out to use the ack deadline)")
    return infra


# ------------------------------------------------------- topology <-> infra
PUBSUB_HEADER = """\
# GENERATED from shared/contracts/topology.py by `python -m tpuq.deploy.infra --write`: edit topology.py, then
# regenerate. `tpuq deploy` refuses this file when it disagrees with topology.py, and so does
# tests/deploy/test_infra.py. Every push carries an OIDC token of ${push_service_account}@<project>, for the
# audience of the receiving service's URL; every subscription dead-letters to ${dead_letter_topic}.
"""


def render_pubsub() -> dict:
    return {
        "push_service_account": PUSH_SERVICE_ACCOUNT,
        "dead_letter_topic": topology.DEAD_LETTER_TOPIC,
        "topics": [{"name": t.name, "description": t.description} for t in topology.TOPICS],
        "subscriptions": [
            {"name": s.name, "topic": s.topic, "service": s.service, "path": s.path,
             "ack_deadline_seconds": s.ack_deadline_seconds, "max_delivery_attempts": s.max_delivery_attempts,
             "min_backoff_seconds": s.min_backoff_seconds, "max_backoff_seconds": s.max_backoff_seconds,
             **({"filter": s.filter} if s.filter else {})}
            for s in topology.SUBSCRIPTIONS
        ],
        # No service consumes it; it keeps dead letters for a week for people to read (tpuq.operations.heldletters).
        "hold_subscriptions": [{"name": topology.DEAD_LETTER_HOLD_SUBSCRIPTION, "topic": topology.DEAD_LETTER_TOPIC,
                                "message_retention_seconds": topology.DEAD_LETTER_HOLD_RETENTION_SECONDS}],
    }


def render_pubsub_text() -> str:
    return PUBSUB_HEADER + yaml.safe_dump(render_pubsub(), sort_keys=False, width=120)


def topology_drift(raw_pubsub: Any) -> list[str]:
    """What differs between infra/pubsub.yaml (parsed) and tpuq.contracts.topology; empty when they agree."""
    expected = render_pubsub()
    if not isinstance(raw_pubsub, dict):
        return ["not a mapping"]
    problems = []
    for key in ("push_service_account", "dead_letter_topic"):
        if raw_pubsub.get(key) != expected[key]:
            problems.append(f"{key}: {raw_pubsub.get(key)!r} != {expected[key]!r}")
    for key in ("topics", "subscriptions", "hold_subscriptions"):
        have = {i.get("name"): i for i in raw_pubsub.get(key) or [] if isinstance(i, dict)}
        want = {i["name"]: i for i in expected[key]}
        for name in sorted(set(have) | set(want)):
            if name not in have:
                problems.append(f"{key}: {name} is missing")
            elif name not in want:
                problems.append(f"{key}: {name} is not in topology")
            elif have[name] != want[name]:
                fields = sorted(k for k in set(have[name]) | set(want[name]) if have[name].get(k) != want[name].get(k))
                problems.append(f"{key}: {name} differs in {', '.join(fields)}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate or check infra/pubsub.yaml from tpuq.contracts.topology")
    parser.add_argument("--write", action="store_true", help="write infra/pubsub.yaml")
    parser.add_argument("--dir", type=Path, default=INFRA_DIR)
    args = parser.parse_args(argv)
    path = args.dir / "pubsub.yaml"
    if args.write:
        path.write_text(render_pubsub_text())
        print(f"wrote {path}")
        return 0
    drift = topology_drift(yaml.safe_load(path.read_text()) if path.exists() else None)
    for line in drift:
        print(line)
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main())
