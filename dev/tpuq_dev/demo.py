"""`tpuq demo`: the whole system on a local stack it starts and stops itself.

1. Brings up the emulators, fake GCS, the fake Cloud TPU (3 zones, one stocked out) with real sshd
   workers, the four services as real processes receiving Pub/Sub push, and the tick source.
2. Submits example jobs the way `tpuq submit` does: one on a 4-host v4-32, one at high priority,
   and one long job whose TPU is preempted once it runs (the demo's scripted spot preemption).
3. Shows live progress.
4. Ends with a summary read back from where the system keeps its facts: Firestore (jobs, attempts),
   GCS (the workers' status objects) and the fake TPU API's call log (creates and deletes).
5. Stops everything it started.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq_dev.devstack.stack import DEMO_DIR, DevStack
from tpuq.contracts.documents import AttemptDoc, JobDoc, JobState, TpuState, short_node_name
from tpuq_dev.faketpu.control import FakeTpuControl
from tpuq.contracts.jobspec import JobFile
from tpuq.operations.submit import prepare, submit_prepared

DEMO_BUCKET = "tpuq-demo-us-central2"

WORK_SH = """\
#!/bin/sh
# The demo's workload: say who we are, then work for a while. A first attempt works FIRST_ATTEMPT_STEPS steps
# if set: the long job's first attempt outlasts the demo's preemption of its TPU, however slow the machine.
echo "worker $TPU_WORKER_ID of $TPU_WORKER_COUNT: job $JOB_ID attempt $ATTEMPT_ID on $(hostname)"
echo "checkpoints go to $CHECKPOINT_GCS_DIR"
steps="${STEPS:-2}"
case "$ATTEMPT_ID" in "$JOB_ID-1") steps="${FIRST_ATTEMPT_STEPS:-$steps}" ;; esac
i=0
while [ $i -lt "$steps" ]; do i=$((i + 1)); echo "step $i"; sleep 1; done
echo done
"""


def demo_jobs(run_id: str) -> dict[str, Any]:
    common = {"bundle": ".", "buckets": [f"gs://{DEMO_BUCKET}"], "command": "sh work.sh"}
    return {"jobs": [
        {**common, "id": f"pod-{run_id}", "name": "4-host slice", "tpu": "v4-32", "env": {"STEPS": "2"}},
        {**common, "id": f"urgent-{run_id}", "name": "urgent", "tpu": ["v4-8", "v4-32"], "priority": "high"},
        {**common, "id": f"long-{run_id}", "name": "preempted once", "tpu": "v4-8", "priority": "low",
         "env": {"STEPS": "6", "FIRST_ATTEMPT_STEPS": "600"}},  # attempt 1 ends by the preemption
    ]}


@dataclass
class DemoResult:
    ok: bool
    summary: dict[str, Any]
    stack: DevStack | None = None  # kept up only when asked (tests cross-check the summary)
    lines: list[str] = field(default_factory=list)


NOT_STORED = "submitted"  # what the demo shows for a job the scheduler has not stored yet


def _job_docs(db, ids: list[str]) -> dict[str, JobDoc | None]:
    """job id -> its view; None while it is not stored."""
    out: dict[str, JobDoc | None] = {}
    for job_id in ids:
        snap = db.collection(store.JOBS).document(job_id).get()
        out[job_id] = JobDoc.from_doc(snap.to_dict(), job_id) if snap.exists else None
    return out


def _state(job: JobDoc | None) -> str:
    return job.state.value if job else NOT_STORED


def _progress(jobs: dict[str, JobDoc | None], fleet_tpus: list[dict], started: float) -> Table:
    table = Table(title=f"tpuq demo — {time.monotonic() - started:.0f}s", title_justify="left")
    for col in ("job", "priority", "state", "attempt", "TPU", "zone"):
        table.add_column(col)
    for job_id, j in jobs.items():
        table.add_row(job_id, (j and j.priority) or "", _state(j), str((j and j.attempt) or ""),
                      short_node_name((j and j.tpu) or ""), (j and j.zone) or "")
    tpus = Table(title="TPUs", title_justify="left")
    for col in ("node", "type", "zone", "state", "job"):
        tpus.add_column(col)
    for t in fleet_tpus:
        tpus.add_row(t.get("short", ""), t.get("type", ""), t.get("zone", ""), t.get("state", ""), t.get("job_id") or "")
    return Group(table, tpus)


def _tpu_docs(db) -> list[dict]:
    return sorted((d.to_dict() for d in db.collection(store.TPUS).stream()), key=lambda t: t.get("short", ""))


def _attempts(db, job_id: str) -> list[AttemptDoc]:
    col = db.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS)
    return sorted((AttemptDoc.from_doc(d.to_dict() or {}, d.id) for d in col.stream()), key=lambda a: a.attempt)


def _status_objects(storage, job_id: str, bucket: str) -> dict[int, list[dict]]:
    """attempt -> the workers' status objects in GCS (they go to the runner bucket)."""
    out: dict[int, list[dict]] = {}
    for blob in storage.list_blobs(bucket, prefix=f"tpuq/status/{job_id}/"):
        parts = blob.name.split("/")
        if len(parts) == 5 and parts[4].startswith("worker-"):
            out.setdefault(int(parts[3]), []).append(json.loads(blob.download_as_bytes()))
    return out


def summarize(clients: Clients, control: FakeTpuControl, job_ids: list[str]) -> dict[str, Any]:
    """Facts only: what Firestore, GCS and the fake TPU's call log say happened."""
    db = clients.firestore
    jobs = _job_docs(db, job_ids)
    calls = control.calls()
    creates = [c for c in calls if c["method"] == "POST" and c["path"].endswith("/queuedResources")]
    qr_deletes = [c for c in calls if c["method"] == "DELETE" and "/queuedResources/" in c["path"]]
    ever_active = {short_node_name(t.get("queued_resource", "")) for t in _tpu_docs(db)}
    deleted = {short_node_name(c["path"].split("?")[0]) for c in qr_deletes if c.get("status", 200) < 300}
    summary: dict[str, Any] = {"jobs": {}, "queued_resources_created": len(creates)}
    for job_id, job in jobs.items():
        attempts = _attempts(db, job_id)
        statuses = _status_objects(clients.storage, job_id, clients.settings.runner_bucket)
        summary["jobs"][job_id] = {
            "state": _state(job),
            "priority": job.priority if job else None,
            "attempts": [{"attempt": a.attempt, "outcome": a.outcome or a.state.value, "zone": a.zone,
                          "region": a.region} for a in attempts],
            "workers_exit_0": {n: sum(1 for s in st if s.get("exit_code") == 0) for n, st in statuses.items()},
            "preemptions": job.preemptions if job else 0,
            "pinned_region": job.pinned_region if job else None,
            "checkpoint_gcs_dir": job.checkpoint_gcs_dir if job else None,
        }
    summary["race_losers_deleted"] = sorted(deleted - ever_active)
    summary["used_tpus_deleted"] = sorted(deleted & ever_active)
    summary["live_tpus"] = [t["short"] for t in _tpu_docs(db) if t.get("state") not in (TpuState.gone, TpuState.deleting)]
    return summary


def run(console: Console | None = None, state_dir: Path | None = None, keep_stack: bool = False,
        timeout: float = 170.0) -> DemoResult:
    console = console or Console()
    started = time.monotonic()
    own_dir = state_dir is None  # made here: removed after a demo that passed (it holds the executor's SSH key)
    state_dir = state_dir or Path(tempfile.mkdtemp(prefix="tpuq-demo-"))
    stack = DevStack(
        state_dir=state_dir, services=("scheduler", "claimer", "executor", "janitor"),
        scenario=DEMO_DIR / "scenario.yaml", fleet_file=DEMO_DIR / "fleet.yaml", time_scale=60.0, tick_period=1.0,
        extra_buckets=(DEMO_BUCKET,),
    )
    with console.status("bringing up the local stack..."):
        env = stack.up()
    os.environ.update(env)
    console.print(f"[green]✓[/green] local stack up in {time.monotonic() - started:.1f}s: "
                  + ", ".join(r["name"] for r in stack.status()))
    console.print("  fake Cloud TPU: zones us-central2-a, us-central2-b (stocked out), us-central2-c; spot v4")
    result = DemoResult(ok=False, summary={})
    try:
        clients = Clients(Settings.from_env(env))
        control = FakeTpuControl(env["TPUQ_TPU_API_ENDPOINT"])
        run_id = f"{random.Random().getrandbits(24):06x}"
        workdir = state_dir / "project"
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "work.sh").write_text(WORK_SH)
        job_file = workdir / "job.yaml"
        spec = demo_jobs(run_id)
        job_file.write_text(json.dumps(spec, indent=2))
        prepared = prepare(job_file, JobFile.model_validate(spec), env.get("TPUQ_RUNNER_BUCKET"), random.Random())
        ids = submit_prepared(clients, prepared)
        for p in prepared:
            console.print(f"→ submitted [bold]{p.spec.id}[/bold] ({p.spec.name}, {', '.join(p.spec.tpu)}, "
                          f"priority {p.spec.priority.value})")
        long_id = f"long-{run_id}"
        preempted_node = None
        deadline = time.monotonic() + timeout
        with Live(console=console, refresh_per_second=4, transient=True) as live:
            while time.monotonic() < deadline:
                jobs = _job_docs(clients.firestore, ids)
                live.update(_progress(jobs, [t for t in _tpu_docs(clients.firestore) if t.get("state") != TpuState.gone],
                                      started))
                long_job = jobs[long_id]
                # The scripted spot preemption: once the long job runs, its TPU is preempted.
                if preempted_node is None and long_job and long_job.state is JobState.running and long_job.tpu:
                    preempted_node = long_job.tpu
                    control.preempt(preempted_node)
                    # A TPU is named after the request that claimed it, often another job's: say whose it is.
                    live.console.print(f"⚡ spot preemption of the TPU {long_id} runs on "
                                       f"({preempted_node.rsplit('/', 1)[-1]}: named after the request that claimed it)")
                if all(j and j.terminal for j in jobs.values()):
                    break
                time.sleep(0.25)
        jobs = _job_docs(clients.firestore, ids)
        for job_id, j in jobs.items():
            ok = j is not None and j.state is JobState.succeeded
            console.print(f"{'[green]✓' if ok else '[red]✗'}[/] {job_id}: {_state(j)} after {(j and j.attempt) or 0} "
                          "attempt(s)")
        with console.status("waiting for the janitor to delete the idle TPUs..."):
            while time.monotonic() < deadline and any(
                    t.get("state") != TpuState.gone for t in _tpu_docs(clients.firestore)):
                time.sleep(0.5)
        summary = summarize(clients, control, ids)
        summary["preempted_node"] = preempted_node
        summary["seconds"] = round(time.monotonic() - started, 1)
        result.summary = summary
        result.ok = _print_summary(console, summary, long_id)
    finally:
        if keep_stack:
            result.stack = stack
        else:
            with console.status("stopping the local stack..."):
                stopped = stack.down()
            console.print(f"[green]✓[/green] stopped {len(stopped)} processes; "
                          f"total {time.monotonic() - started:.0f}s")
            if own_dir and result.ok:
                shutil.rmtree(state_dir, ignore_errors=True)
            elif own_dir:
                console.print(f"the services' logs are in {stack.log_dir} (remove {state_dir} when done: it holds "
                              "the stack's private SSH key)")
    return result


def _print_summary(console: Console, s: dict[str, Any], long_id: str) -> bool:
    checks = []
    every_job_succeeded = all(j["state"] == JobState.succeeded for j in s["jobs"].values())
    checks.append((every_job_succeeded, "every job succeeded: " + ", ".join(
        f"{k} ({len(v['attempts'])} attempt{'s' if len(v['attempts']) != 1 else ''})" for k, v in s["jobs"].items())))
    long_job = s["jobs"].get(long_id, {})
    attempts = long_job.get("attempts", [])
    regions = {a.get("region") for a in attempts}
    # One checkpoint dir per job (jobs/{id}.checkpoint_gcs_dir, kept by a retry in its pinned region).
    retried = (len(attempts) >= 2 and attempts[0].get("outcome") == "preempted" and len(regions) == 1
               and bool(long_job.get("checkpoint_gcs_dir")))
    checks.append((retried, f"the preempted job was retried in its region: "
                            f"{' → '.join(str(a.get('outcome')) + '@' + str(a.get('zone')) for a in attempts)} "
                            f"(region {', '.join(sorted(r for r in regions if r))}, same checkpoint dir)"))
    checks.append((bool(s["race_losers_deleted"]),
                   f"race losers cancelled: {len(s['race_losers_deleted'])} queued resource(s) deleted that never "
                   f"served a job ({s['queued_resources_created']} created in all)"))
    checks.append((not s["live_tpus"] and bool(s["used_tpus_deleted"]),
                   f"idle TPUs deleted: {len(s['used_tpus_deleted'])}; still up: {len(s['live_tpus'])}"))
    console.print("\n[bold]summary[/bold] (read back from Firestore, GCS and the fake TPU's call log)")
    for ok, text in checks:
        console.print(f"  {'[green]✓' if ok else '[red]✗'}[/] {text}")
    console.print(f"  total {s['seconds']}s")
    return all(ok for ok, _ in checks)
