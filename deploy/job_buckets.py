"""The fleet's `job_buckets`: the buckets jobs list under `buckets:`, where workers read bundles and write logs.

infra/iam.yaml grants the workers' account roles/storage.objectAdmin on each (`job_bucket:${job_buckets}`),
merged into the bucket's IAM policy by read-modify-write like every grant, so no other binding changes.
tpuq never creates these buckets (they hold the user's data, in the user's regions): one that does not
exist is a todo, and its grant is left out of the plan until it does. So is one whose IAM policy deploy may not
read (403, not an API still being enabled: a bucket of another project, say): a grant would read it first and
fail, stopping the deploy halfway, so its grants become commands for the bucket's owner and the deploy goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpuq.deploy.infra import Infra
from tpuq.deploy.model import Action, ProjectState, Target
from tpuq.contracts.fleet import worker_service_account

RESOURCE_PREFIX = "job_bucket:"  # infra/iam.yaml's resource kind for them


def bucket_of(resource_key: str) -> str | None:
    """The job bucket an IAM resource key names (`job_bucket:NAME`), else None."""
    return resource_key.removeprefix(RESOURCE_PREFIX) if resource_key.startswith(RESOURCE_PREFIX) else None


def read_missing(storage, target: Target, tolerant: Callable[[Callable[[], Any], str], Any]) -> set[str]:
    """The job buckets that do not exist (a 404); one that cannot be read (403) is noted and assumed present."""
    missing = set()
    for name in target.fleet.job_bucket_names:
        found = tolerant(lambda: storage.get_or_none(f"b/{name}") or {}, f"job bucket gs://{name}")
        if found == {}:
            missing.add(name)
    return missing


def todos(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    account = worker_service_account(target.project)
    out = []
    for name in target.fleet.job_bucket_names:
        if name in state.missing_buckets:
            out.append(Action("todo", f"bucket gs://{name}", "(the fleet's job_buckets) does not exist: create it in "
                              f"the region of its TPUs, then deploy again to let {account} read bundles from it and "
                              "write logs to it",
                              commands=(f"gcloud storage buckets create gs://{name} --location=REGION "
                                        f"--uniform-bucket-level-access --project={target.project}",)))
        elif name in state.unreadable_job_buckets:
            out.append(Action("todo", f"bucket gs://{name}", "(the fleet's job_buckets): tpuq deploy may not read its "
                              "IAM policy (HTTP 403; a bucket of another project?), so it grants nothing on it. FOR "
                              "THE BUCKET'S OWNER TO RUN (nothing is left to do if they did already): these let "
                              f"{account} read bundles from it and write logs to it, and the dashboard read the logs",
                              commands=owner_commands(target, infra, name)))
    return out


def owner_commands(target: Target, infra: Infra, name: str) -> tuple[str, ...]:
    """The grants infra/iam.yaml makes on this job bucket, as the commands its owner runs (each adds one binding)."""
    return tuple(f"gcloud storage buckets add-iam-policy-binding gs://{name} --member={target.member(b.member)} "
                 f"--role={b.role}" for b in infra.iam.bindings if bucket_of(b.resource) == name)


def policy_refused(status: int, service_disabled: bool) -> bool:
    """A job bucket's policy read that no later deploy would find readable either: refused, and not because the
    Cloud Storage API is being enabled (then the next deploy reads it)."""
    return status == 403 and not service_disabled
