"""Core (pure): does a job file fit the fleet it will run on, as far as the two files alone tell?

`tpuq validate fleet.yaml job.yaml` checks each file on its own and then the pair: a bucket a job lists (or reads its
bundle from) that the fleet's `job_buckets` does not name is one deploy never lets the workers write
(docs/DEPLOYING.md, "Network, firewall, OS Login and buckets", step 7), and a fleet naming no `ssh_key_secret` gets
no executor from deploy, so no job starts.
Both are warnings: the grant may have been made by hand, and the fleet may only be stored, not deployed.
"""

from __future__ import annotations

from tpuq.contracts.fleet import FleetFile, worker_service_account
from tpuq.contracts.jobspec import JobFile, split_gs_uri


def job_bucket_uses(jobs: JobFile) -> list[tuple[str, str, str]]:
    """(job name, bucket, how the workers use it) for every bucket the jobs name, in order."""
    out = []
    for i, job in enumerate(jobs.jobs):
        name = job.name or job.id or f"jobs[{i}]"
        for b in job.buckets:
            out.append((name, b.name, "lists"))
        if job.bundle and job.bundle.startswith("gs://"):
            out.append((name, split_gs_uri(job.bundle)[0], "reads its bundle from"))
    return out


def fleet_job_warnings(fleet: FleetFile, jobs: JobFile) -> list[str]:
    granted = set(fleet.job_bucket_names)
    account = worker_service_account(fleet.project)
    out = []
    for job, bucket, how in job_bucket_uses(jobs):
        if bucket not in granted:
            out.append(f"job {job} {how} gs://{bucket}, which fleet {fleet.name}'s job_buckets does not name: deploy "
                       f"lets the workers' account {account} use only those buckets; add gs://{bucket} to job_buckets "
                       "(or grant it roles/storage.objectAdmin on the bucket yourself)")
    if not fleet.ssh_key_secret:
        out.append(f"fleet {fleet.name} names no ssh_key_secret: tpuq deploy then deploys no executor, and no job "
                   "starts; name the Secret Manager secret of the executor's SSH key pair (`tpuq deploy --dry-run` "
                   "prints the commands that make it)")
    return out
