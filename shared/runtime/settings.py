"""Settings: everything a service, the CLI or a tool reads from its environment, read once into one object.

`Settings.from_env()` is called once, by whoever starts the process (a service's entry module on its first
request, the CLI, a test), and the object is passed in from there: no module reads `os.environ` for its own
setting. On Cloud Run the variables come from the service's revision (deploy's `Infra.server_env`); locally from
`tpuq dev env`. A value that does not parse is refused with the variable's name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

ENV_PROJECT = "GOOGLE_CLOUD_PROJECT"
ENV_TPU_ENDPOINT = "TPUQ_TPU_API_ENDPOINT"
ENV_CLOUDQUOTAS_ENDPOINT = "TPUQ_CLOUDQUOTAS_API_ENDPOINT"  # the quota pre-check's Cloud Quotas API (tpuq.capacity.cloudchecks)
ENV_CLOUDBILLING_ENDPOINT = "TPUQ_CLOUDBILLING_API_ENDPOINT"  # ... and Cloud Billing API
ENV_SECRETMANAGER_ENDPOINT = "TPUQ_SECRETMANAGER_API_ENDPOINT"  # Secret Manager (tpuq.runtime.secretmanager)
ENV_TOPIC_PREFIX = "TPUQ_TOPIC_PREFIX"  # tests isolate themselves with a prefix
ENV_RUNNER_BUCKET = "TPUQ_RUNNER_BUCKET"
ENV_FLEET = "TPUQ_FLEET"  # which stored fleet a process serves when several are stored
ENV_WORKER_SERVICE_ACCOUNT = "TPUQ_WORKER_SERVICE_ACCOUNT"  # the claimer attaches it to the TPU VMs it creates
ENV_SSH_PRIVATE_KEY_FILE = "TPUQ_SSH_PRIVATE_KEY_FILE"  # the executor's key, mounted from Secret Manager
ENV_EXECUTOR_KEEP_SSH = "TPUQ_EXECUTOR_KEEP_SSH"  # 0: a new SSH connection per call
ENV_EXECUTOR_PROBE_SECONDS = "TPUQ_EXECUTOR_PROBE_SECONDS"  # how often a running attempt's workers are probed
# How long, after one worker of a slice failed, the others are given to report before the attempt ends failed.
ENV_EXECUTOR_FAILURE_GRACE_SECONDS = "TPUQ_EXECUTOR_FAILURE_GRACE_SECONDS"
ENV_ORPHAN_SCAN_SECONDS = "TPUQ_JANITOR_ORPHAN_SCAN_SECONDS"  # how often the janitor lists a zone for orphans
ENV_REPUBLISH_ASSIGNMENT_SECONDS = "TPUQ_REPUBLISH_ASSIGNMENT_SECONDS"  # an unstarted assignment is sent again
ENV_BACKSTOP_SECONDS = "TPUQ_BACKSTOP_SECONDS"  # how often each service looks for lost events (and reads all again)
ENV_CLOUD_RUN = "K_SERVICE"  # Cloud Run sets it in every container

DEFAULT_PROBE_SECONDS = 60.0
DEFAULT_FAILURE_GRACE_SECONDS = 30.0  # one host failing kills a slice: the others' reports come within it
DEFAULT_ORPHAN_SCAN_SECONDS = 600.0  # a per-zone list is the only scan tpuq makes: rarely
DEFAULT_REPUBLISH_ASSIGNMENT_SECONDS = 300.0
# tpuq.scheduler.backstops: a lost event (dead-lettered, or a handler that died between its writes and its
# publish) caught within a quarter of an hour. Each period costs reads of what is live, so the period sets most of
# a busy deployment's Firestore bill (issue 34 §1: 5 minutes cost ~15,000 reads a day more on the standard month).
DEFAULT_BACKSTOP_SECONDS = 900.0


class SettingsError(ValueError):
    """A variable whose value does not parse: the message names it."""


def _seconds(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"${name} must be a number of seconds, not {raw!r}") from None
    if value < 0:
        raise SettingsError(f"${name} must not be negative, not {raw!r}")
    return value


@dataclass
class Settings:
    project: str
    tpu_endpoint: str | None = None
    quotas_endpoint: str | None = None
    billing_endpoint: str | None = None
    secretmanager_endpoint: str | None = None  # None: https://secretmanager.googleapis.com
    topic_prefix: str = ""
    runner_bucket: str | None = None
    storage_emulator: str | None = None
    pubsub_emulator: str | None = None
    firestore_emulator: str | None = None
    fleet: str | None = None
    worker_service_account: str | None = None
    ssh_private_key_file: str | None = None
    executor_keep_ssh: bool = True
    executor_probe_seconds: float = DEFAULT_PROBE_SECONDS
    executor_failure_grace_seconds: float = DEFAULT_FAILURE_GRACE_SECONDS
    orphan_scan_seconds: float = DEFAULT_ORPHAN_SCAN_SECONDS
    republish_assignment_seconds: float = DEFAULT_REPUBLISH_ASSIGNMENT_SECONDS
    backstop_seconds: float = DEFAULT_BACKSTOP_SECONDS
    on_cloud_run: bool = False
    # The snapshot the fields were read from, for the few readers that own a group of variables of their own
    # (push authentication, tpuq.runtime.auth; the claimer's SSH public key, tpuq.claimer.sshkeys): read from here,
    # never from os.environ again.
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        return cls(
            project=env.get(ENV_PROJECT) or env.get("GCLOUD_PROJECT") or "tpuq-local",
            tpu_endpoint=env.get(ENV_TPU_ENDPOINT) or None,
            quotas_endpoint=env.get(ENV_CLOUDQUOTAS_ENDPOINT) or None,
            billing_endpoint=env.get(ENV_CLOUDBILLING_ENDPOINT) or None,
            secretmanager_endpoint=env.get(ENV_SECRETMANAGER_ENDPOINT) or None,
            topic_prefix=env.get(ENV_TOPIC_PREFIX, ""),
            runner_bucket=env.get(ENV_RUNNER_BUCKET) or None,
            storage_emulator=env.get("STORAGE_EMULATOR_HOST") or None,
            pubsub_emulator=env.get("PUBSUB_EMULATOR_HOST") or None,
            firestore_emulator=env.get("FIRESTORE_EMULATOR_HOST") or None,
            fleet=env.get(ENV_FLEET) or None,
            worker_service_account=env.get(ENV_WORKER_SERVICE_ACCOUNT) or None,
            ssh_private_key_file=env.get(ENV_SSH_PRIVATE_KEY_FILE) or None,
            executor_keep_ssh=env.get(ENV_EXECUTOR_KEEP_SSH, "1").strip() != "0",
            executor_probe_seconds=_seconds(env, ENV_EXECUTOR_PROBE_SECONDS, DEFAULT_PROBE_SECONDS),
            executor_failure_grace_seconds=_seconds(env, ENV_EXECUTOR_FAILURE_GRACE_SECONDS,
                                                    DEFAULT_FAILURE_GRACE_SECONDS),
            orphan_scan_seconds=_seconds(env, ENV_ORPHAN_SCAN_SECONDS, DEFAULT_ORPHAN_SCAN_SECONDS),
            republish_assignment_seconds=_seconds(env, ENV_REPUBLISH_ASSIGNMENT_SECONDS,
                                                  DEFAULT_REPUBLISH_ASSIGNMENT_SECONDS),
            backstop_seconds=_seconds(env, ENV_BACKSTOP_SECONDS, DEFAULT_BACKSTOP_SECONDS),
            on_cloud_run=bool(env.get(ENV_CLOUD_RUN)),
            env=env,
        )

    @property
    def emulator_env(self) -> dict[str, str | None]:
        return {
            "PUBSUB_EMULATOR_HOST": self.pubsub_emulator,
            "FIRESTORE_EMULATOR_HOST": self.firestore_emulator,
            "STORAGE_EMULATOR_HOST": self.storage_emulator,
        }

    @property
    def executor_probe_every(self) -> timedelta:
        return timedelta(seconds=self.executor_probe_seconds)

    @property
    def executor_failure_grace(self) -> timedelta:
        return timedelta(seconds=self.executor_failure_grace_seconds)

    @property
    def republish_assignment_after(self) -> timedelta:
        return timedelta(seconds=self.republish_assignment_seconds)

    @property
    def backstop_every(self) -> timedelta:
        return timedelta(seconds=self.backstop_seconds)

    def topic_path(self, name: str) -> str:
        return f"projects/{self.project}/topics/{self.topic_prefix}{name}"

    def subscription_path(self, name: str) -> str:
        return f"projects/{self.project}/subscriptions/{self.topic_prefix}{name}"
