"""The fleet's `job_buckets`: the buckets jobs list under `buckets:`, where workers read bundles and write logs.

infra/iam.yaml grants the workers' account roles/storage.objectAdmin on each (`job_bucket:${job_buckets}`),
merged into the bucket's IAM policy by read-modify-write like every grant, so no other binding changes.
tpuq never creates these buckets (they hold the user's data, in the user's regions): one that does not
exist is a todo, and its grant is left out of the plan until it does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpuq.deploy.plan import Action, ProjectState, Target
from tpuq.fleet import worker_service_account


def read_missing(storage, target: Target, tolerant: Callable[[Callable[[], Any], str], Any]) -> set[str]:
    """The job buckets that do not exist (a 404); one that cannot be read (403) is noted and assumed present."""
    missing = set()
    for name in target.fleet.job_bucket_names:
        found = tolerant(lambda: storage.get_or_none(f"b/{name}") or {}, f"job bucket gs://{name}")
        if found == {}:
            missing.add(name)
    return missing


def todos(target: Target, state: ProjectState) -> list[Action]:
    account = worker_service_account(target.project)
    return [Action("todo", f"bucket gs://{name}", "(the fleet's job_buckets) does not exist: create it in the region "
                   f"of its TPUs, then deploy again to let {account} read bundles from it and write logs to it",
                   commands=(f"gcloud storage buckets create gs://{name} --location=REGION "
                             f"--uniform-bucket-level-access --project={target.project}",))
            for name in target.fleet.job_bucket_names if name in state.missing_buckets]
