"""The job commands: submit, status, list, cancel, logs, watch."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from tpuq.cli.connecting import cli_clients, job_or_fail
from tpuq.cli.console import CliError, err, out
from tpuq.cli.files import load_yaml_file, validate_data
from tpuq.cli.views import json_default, print_job, print_job_table, watch_view
from tpuq.documents import TERMINAL_JOB_STATES, JobState


def submit(job_file: Path = typer.Argument(..., help="job.yaml"),
           wait: bool = typer.Option(False, "--wait", help="Wait until every job ends; exit 1 if one did not succeed"),
           timeout: float = typer.Option(0, help="With --wait: give up after this many seconds (0: never)"),
           force: bool = typer.Option(False, "--force", help="Submit even a job no fleet entry can run (it waits, "
                                                             "blocked, until a `tpuq fleet apply` offers its TPU)")) -> None:
    """Bundle the job directory, upload it to each candidate bucket, and publish the jobs."""
    import random

    from tpuq.bundle import BundleError
    from tpuq.jobspec import JobFile
    from tpuq.submit import prepare, submit_prepared

    jobs = validate_data(load_yaml_file(job_file), "job")
    assert isinstance(jobs, JobFile)
    clients = cli_clients()
    try:
        prepared = prepare(job_file, jobs, clients.settings.runner_bucket, random.Random())
    except (BundleError, ValueError) as e:
        raise CliError(str(e)) from None
    _check_runnable(clients, prepared, force)
    _check_job_buckets(clients, prepared)
    ids = submit_prepared(clients, prepared)
    for p, job_id in zip(prepared, ids):
        note = f" (bundle {p.bundle.sha256[:12]}, {p.bundle.files} files)" if p.bundle else ""
        out.print(f"submitted [bold]{job_id}[/bold]{note}")
    if wait:
        raise typer.Exit(_wait_for_jobs(clients, ids, timeout))


def _check_runnable(clients, prepared, force: bool) -> None:
    """A job no entry of the stored fleet can run is refused (one line per job), unless --force."""
    from datetime import datetime, timezone

    from tpuq.errors import TpuqError
    from tpuq.fleetstore import load_fleet
    from tpuq.submit import unrunnable_jobs

    try:
        fleet = load_fleet(clients.firestore)
    except TpuqError:
        return  # no fleet stored (or several, none chosen): nothing to check against; the scheduler decides
    lines = unrunnable_jobs(prepared, fleet, datetime.now(timezone.utc))
    if lines and force:
        for line in lines:
            err.print(f"[yellow]warning:[/yellow] {line}; submitted anyway (--force): it waits blocked",
                      highlight=False, markup=True)
    elif lines:
        raise CliError("; ".join(lines) + " (--force submits anyway)")


def _check_job_buckets(clients, prepared) -> None:
    """Every bucket must exist (else one line and exit 1); one the workers cannot write is a warning."""
    from tpuq.fleet import worker_service_account
    from tpuq.submit import check_buckets, storage_bucket_checks

    exists, read_bindings = storage_bucket_checks(clients.storage, emulated=bool(clients.settings.storage_emulator))
    errors, warnings = check_buckets(prepared, exists, read_bindings, worker_service_account(clients.settings.project))
    for line in warnings:
        err.print(f"[yellow]warning:[/yellow] {line}", highlight=False)
    if errors and clients.settings.storage_emulator:
        names = sorted(f"gs://{b.name}" for b in clients.storage.list_buckets())
        errors.append(f"the local stack has {', '.join(names) or 'no bucket'} (`tpuq dev up` makes one per region "
                      "of its fleet)")
    if errors:
        raise CliError("; ".join(errors))


def _wait_for_jobs(clients, ids: list[str], timeout: float) -> int:
    import time

    deadline = time.monotonic() + timeout if timeout else None
    final: dict[str, str] = {}
    with err.status("waiting for the jobs to end...") as status:
        while len(final) < len(ids):
            for job_id in ids:
                if job_id in final:
                    continue
                snap = clients.firestore.collection("jobs").document(job_id).get()
                state = (snap.to_dict() or {}).get("state") if snap.exists else "submitted"
                if state in TERMINAL_JOB_STATES:
                    final[job_id] = state
                    out.print(f"{job_id}: {state}")
            status.update(f"waiting: {len(ids) - len(final)} of {len(ids)} jobs still running...")
            if deadline and time.monotonic() > deadline:
                err.print(f"gave up waiting after {timeout:.0f}s")
                return 1
            time.sleep(0.5)
    return 0 if all(s == JobState.succeeded for s in final.values()) else 1


def status(job_id: Optional[str] = typer.Argument(None, help="A job id; omit for the recent jobs"),
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output")) -> None:
    """Show one job (state, attempts, reason) or the recent jobs."""
    from datetime import datetime, timezone

    from tpuq.queries import attempts, list_jobs

    clients = cli_clients()
    db = clients.firestore
    if job_id is None:
        rows = list_jobs(db, limit=20)
        _annotate_waiting(db, rows)
        blocks = _fleet_blocks(db)
        for row in rows:
            if row.get("state") == JobState.pending and blocks and not row.get("blocked"):
                row["blocked"] = "blocked: " + blocks[0]
        if as_json:
            print(json.dumps(rows, default=json_default, indent=2))
        else:
            print_job_table(rows, datetime.now(timezone.utc))
        return
    job = job_or_fail(db, job_id)
    job["attempt_history"] = attempts(db, job_id)
    _annotate_waiting(db, [job])
    if as_json:
        print(json.dumps(job, default=json_default, indent=2))
        return
    print_job(job_id, job, _fleet_blocks(db) if job.get("state") == JobState.pending else [])

def _annotate_waiting(db, jobs: list[dict]) -> None:
    """`waiting` on each pending job: what holds it (brakes, back-offs, drops), times in the local zone."""
    from datetime import datetime, timezone

    from tpuq.cli.fleet import local_zone
    from tpuq.fleetreport import annotate_waiting

    annotate_waiting(db, jobs, datetime.now(timezone.utc), local_zone())


def _fleet_blocks(db) -> list[str]:
    """Project-level blocks the claimer recorded (billing, permission): every waiting job is held by them."""
    from tpuq import store

    return [d.to_dict()["blocked"] for d in db.collection(store.FLEET_STATUS).stream() if (d.to_dict() or {}).get("blocked")]


def list_(state: Optional[str] = typer.Option(None, help="Only jobs in this state"),
          limit: int = typer.Option(50, min=1, max=1000)) -> None:
    """List recent jobs, newest first."""
    from datetime import datetime, timezone

    from tpuq.queries import list_jobs

    db = cli_clients().firestore
    rows = list_jobs(db, limit=limit, state=state)
    _annotate_waiting(db, rows)
    print_job_table(rows, datetime.now(timezone.utc))


def cancel(job_id: str = typer.Argument(...), reason: str = typer.Option("cancelled by user")) -> None:
    """Cancel a job: a pending one at once, a running one by stopping it on every worker."""
    from tpuq.messages import CancelRequest

    clients = cli_clients()
    job = job_or_fail(clients.firestore, job_id)
    if job.get("state") in TERMINAL_JOB_STATES:
        out.print(f"{job_id} already ended: {job.get('state')}")
        return
    clients.publish("cancels", CancelRequest(job_id=job_id, reason=reason, requested_by=os.environ.get("USER")))
    out.print(f"cancel requested for {job_id} (state was {job.get('state')})")


def logs(job_id: str = typer.Argument(...),
         follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until the job ends"),
         worker: Optional[int] = typer.Option(None, "--worker", min=0, help="Only this worker"),
         attempt: Optional[int] = typer.Option(None, "--attempt", min=1, help="Another attempt than the latest")) -> None:
    """Print a job's logs, each line prefixed by its worker."""
    import time

    from tpuq.queries import worker_log_chunks

    clients = cli_clients()
    seen: dict[int, int] = {}
    partial: dict[int, str] = {}
    while True:
        job = job_or_fail(clients.firestore, job_id)
        for chunk in worker_log_chunks(clients.storage, job, attempt, worker, after=seen):
            seen[chunk.worker] = chunk.seq
            text = partial.pop(chunk.worker, "") + chunk.text
            lines = text.split("\n")
            partial[chunk.worker] = lines.pop()  # an unfinished line waits for the next chunk
            for line in lines:
                print(f"[w{chunk.worker}] {line}", flush=True)
        if not follow or job.get("state") in TERMINAL_JOB_STATES:
            break
        time.sleep(1.0)
    for w, rest in sorted(partial.items()):
        if rest:
            print(f"[w{w}] {rest}")
    if not seen and not follow:
        err.print(f"no logs yet for {job_id} (state {job.get('state')})")


def watch(job_id: str = typer.Argument(...), interval: float = typer.Option(1.0, min=0.2)) -> None:
    """A live view of one job with per-worker state. Exit 0 on success, 1 on failure, 130 on Ctrl-C."""
    import time

    from rich.live import Live

    from tpuq.queries import worker_statuses

    clients = cli_clients()
    try:
        with Live(console=out, refresh_per_second=4, transient=False) as live:
            while True:
                job = job_or_fail(clients.firestore, job_id)
                statuses = worker_statuses(clients.storage, job, status_bucket=clients.settings.runner_bucket)
                live.update(watch_view(job, statuses))
                if job.get("state") in TERMINAL_JOB_STATES:
                    break
                time.sleep(interval)
    except KeyboardInterrupt:
        raise typer.Exit(130)
    raise typer.Exit(0 if job.get("state") == JobState.succeeded else 1)
