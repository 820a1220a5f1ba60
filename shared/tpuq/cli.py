"""The `tpuq` command line.

Errors are one clear line on stderr and a non-zero exit; tracebacks are for
bugs only (set TPUQ_DEBUG=1 to see them for any error).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tpuq.documents import JOB_STATES_ON_A_TPU, TERMINAL_JOB_STATES, JobState
from tpuq.errors import TpuqError, describe_validation_error

app = typer.Typer(help="tpuq: an event-driven job queue for Cloud TPU allocations.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
dev_app = typer.Typer(help="The local cloud stack (emulators, fake TPU API, services).", no_args_is_help=True)
app.add_typer(dev_app, name="dev")
fleet_app = typer.Typer(help="Queued resources, TPUs, states, idle times and blocked reasons; `apply` stores a fleet file.",
                        invoke_without_command=True)
app.add_typer(fleet_app, name="fleet")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class CliError(Exception):
    """An error the user can act on: printed as one line."""


# ----------------------------------------------------------------- files
def load_yaml_file(path: Path) -> object:
    if not path.exists():
        raise CliError(f"{path}: no such file")
    if path.is_dir():
        raise CliError(f"{path}: is a directory, expected a YAML file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise CliError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a text file") from None


def detect_kind(data: object) -> str:
    if isinstance(data, dict) and "tpus" in data:
        return "fleet"
    return "job"


def validate_data(data: object, kind: str):
    from tpuq.fleet import FleetFile
    from tpuq.jobspec import JobFile

    model = FleetFile if kind == "fleet" else JobFile
    if not isinstance(data, dict):
        raise CliError(f"expected a YAML mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        _, reason = describe_validation_error(e)
        raise CliError(f"invalid {kind} file: {reason}") from None


@app.command()
def validate(file: Path = typer.Argument(..., help="A fleet file or a job.yaml")) -> None:
    """Check a fleet or job file and say what is wrong, field by field."""
    data = load_yaml_file(file)
    kind = detect_kind(data)
    model = validate_data(data, kind)
    if kind == "fleet":
        for note in model.transport_notes():
            err.print(f"[yellow]warning[/yellow]: {escape(note)}", soft_wrap=True)
        out.print(f"[green]ok[/green]: fleet {model.name!r} with {len(model.tpus)} TPU entr{'y' if len(model.tpus) == 1 else 'ies'}")
    else:
        out.print(f"[green]ok[/green]: {len(model.jobs)} job{'s' if len(model.jobs) != 1 else ''}")


@app.command()
def demo(state_dir: Optional[Path] = typer.Option(None, help="Keep the demo's state and logs here")) -> None:
    """Run the end-to-end demo on a local stack it starts and stops itself."""
    from tpuq.demo import run

    result = run(out, state_dir)
    if not result.ok:
        raise typer.Exit(1)


# ------------------------------------------------------------- clients
def _reachable(hostport: str) -> bool:
    import socket

    host, _, port = hostport.replace("http://", "").rstrip("/").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except (OSError, ValueError):
        return False


def cli_clients():
    """Clients for the CLI: the environment's emulators, else a running dev stack's, else production (ADC)."""
    from tpuq.clients import Clients, Settings
    from tpuq.devstack.stack import StackError, load_env

    env = dict(os.environ)
    if not any(k in env for k in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST")):
        try:
            local = load_env()
        except StackError:
            local = {}
        if local:
            env.update(local)
            os.environ.update(local)
    for key in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST", "STORAGE_EMULATOR_HOST"):
        if env.get(key) and not _reachable(env[key]):
            raise CliError(f"the local stack is not running ({key}={env[key]} does not answer): start it with `tpuq dev up`")
    if "FIRESTORE_EMULATOR_HOST" not in env:
        _check_credentials()
    return Clients(Settings.from_env(env))


def _check_credentials() -> None:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError

    try:
        credentials, _ = google.auth.default()
        if not credentials.valid:
            from google.auth.transport.requests import Request

            credentials.refresh(Request())
    except DefaultCredentialsError:
        raise CliError("no Google Cloud credentials: run `gcloud auth application-default login` "
                       "(or start the local stack with `tpuq dev up`)") from None
    except RefreshError as e:
        raise CliError(f"your Google Cloud credentials have expired or were revoked ({_one_line(e)}): "
                       "run `gcloud auth application-default login`") from None
    except TransportError:
        raise CliError("could not refresh your Google Cloud credentials: Google's token service is out of reach "
                       "(no network?)") from None


def _job_or_fail(db, job_id: str) -> dict:
    from tpuq.queries import UnknownJob, get_job

    try:
        return get_job(db, job_id)
    except UnknownJob as e:
        raise CliError(str(e)) from None


def _json_default(value):
    from datetime import datetime

    return value.isoformat() if isinstance(value, datetime) else str(value)


# ------------------------------------------------------------------ jobs
@app.command()
def init(directory: Path = typer.Argument(Path("."), help="Where to write fleet.yaml and job.yaml"),
         force: bool = typer.Option(False, "--force", help="Overwrite existing files")) -> None:
    """Write example fleet and job files, with comments."""
    from tpuq.examples import EXAMPLE_FLEET, EXAMPLE_JOB

    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (("fleet.yaml", EXAMPLE_FLEET), ("job.yaml", EXAMPLE_JOB)):
        path = directory / name
        if path.exists() and not force:
            raise CliError(f"{path} already exists (use --force to overwrite)")
        path.write_text(text)
        out.print(f"wrote {path}")
    out.print("next: edit them, then `tpuq validate fleet.yaml` and `tpuq submit job.yaml`")


@app.command()
def submit(job_file: Path = typer.Argument(..., help="job.yaml"),
           wait: bool = typer.Option(False, "--wait", help="Wait until every job ends; exit 1 if one did not succeed"),
           timeout: float = typer.Option(0, help="With --wait: give up after this many seconds (0: never)")) -> None:
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
    _check_job_buckets(clients, prepared)
    ids = submit_prepared(clients, prepared)
    for p, job_id in zip(prepared, ids):
        note = f" (bundle {p.bundle.sha256[:12]}, {p.bundle.files} files)" if p.bundle else ""
        out.print(f"submitted [bold]{job_id}[/bold]{note}")
    if wait:
        raise typer.Exit(_wait_for_jobs(clients, ids, timeout))


def _check_job_buckets(clients, prepared) -> None:
    """Every bucket must exist (else one line and exit 1); one the workers cannot write is a warning."""
    from tpuq.fleet import worker_service_account
    from tpuq.submit import check_buckets, storage_bucket_checks

    exists, read_bindings = storage_bucket_checks(clients.storage, emulated=bool(clients.settings.storage_emulator))
    errors, warnings = check_buckets(prepared, exists, read_bindings, worker_service_account(clients.settings.project))
    for line in warnings:
        err.print(f"[yellow]warning:[/yellow] {line}", highlight=False)
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


@app.command()
def status(job_id: Optional[str] = typer.Argument(None, help="A job id; omit for the recent jobs"),
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output")) -> None:
    """Show one job (state, attempts, reason) or the recent jobs."""
    from datetime import datetime, timezone

    from tpuq.queries import attempts, list_jobs

    clients = cli_clients()
    db = clients.firestore
    if job_id is None:
        rows = list_jobs(db, limit=20)
        blocks = _fleet_blocks(db)
        for row in rows:
            if row.get("state") == JobState.pending and blocks and not row.get("blocked"):
                row["blocked"] = "blocked: " + blocks[0]
        if as_json:
            print(json.dumps(rows, default=_json_default, indent=2))
        else:
            _print_job_table(rows, datetime.now(timezone.utc))
        return
    job = _job_or_fail(db, job_id)
    job["attempt_history"] = attempts(db, job_id)
    if as_json:
        print(json.dumps(job, default=_json_default, indent=2))
        return
    spec = job.get("spec") or {}
    out.print(f"[bold]{job_id}[/bold]  state: {_state_style(job.get('state'))}  priority: {job.get('priority')}  "
              f"source: {job.get('source')}")
    if spec:
        out.print(f"  tpu: {', '.join(spec.get('tpu', []))}   command: {spec.get('command')}")
    for key in ("reason", "blocked", "tpu", "zone", "job_bucket", "checkpoint_gcs_dir"):
        if job.get(key):
            out.print(f"  {key}: {job[key]}")
    if job.get("state") == JobState.pending:
        for reason in _fleet_blocks(db):
            out.print(f"  [red]blocked:[/red] {reason}")
    for a in job["attempt_history"]:
        out.print(f"  attempt {a.get('attempt')}: {a.get('state') or ''} {a.get('outcome') or ''} on "
                  f"{a.get('tpu') or '?'} {('- ' + a['detail'][:200]) if a.get('detail') else ''}")


def _fleet_blocks(db) -> list[str]:
    """Project-level blocks the claimer recorded (billing, permission): every waiting job is held by them."""
    from tpuq import store

    return [d.to_dict()["blocked"] for d in db.collection(store.FLEET_STATUS).stream() if (d.to_dict() or {}).get("blocked")]


def _state_style(state) -> str:
    colour = {JobState.succeeded: "green", JobState.failed: "red", JobState.rejected: "red",
              JobState.cancelled: "yellow", JobState.running: "cyan", JobState.assigned: "cyan"}.get(state or "", "white")
    return f"[{colour}]{state}[/{colour}]"


def _print_job_table(rows, now) -> None:
    from tpuq.queries import age

    if not rows:
        out.print("no jobs yet (tpuq submit job.yaml)")
        return
    table = Table("job", "state", "priority", "tpu", "age", "reason")
    for j in rows:
        table.add_row(j.get("id", ""), _state_style(j.get("state")), j.get("priority") or "",
                      ",".join((j.get("spec") or {}).get("tpu", [])), age(j.get("submit_time"), now),
                      (j.get("reason") or j.get("blocked") or "")[:60])
    out.print(table)


@app.command("list")
def list_(state: Optional[str] = typer.Option(None, help="Only jobs in this state"),
          limit: int = typer.Option(50, min=1, max=1000)) -> None:
    """List recent jobs, newest first."""
    from datetime import datetime, timezone

    from tpuq.queries import list_jobs

    _print_job_table(list_jobs(cli_clients().firestore, limit=limit, state=state), datetime.now(timezone.utc))


@app.command()
def cancel(job_id: str = typer.Argument(...), reason: str = typer.Option("cancelled by user")) -> None:
    """Cancel a job: a pending one at once, a running one by stopping it on every worker."""
    from tpuq.messages import CancelRequest

    clients = cli_clients()
    job = _job_or_fail(clients.firestore, job_id)
    if job.get("state") in TERMINAL_JOB_STATES:
        out.print(f"{job_id} already ended: {job.get('state')}")
        return
    clients.publish("cancels", CancelRequest(job_id=job_id, reason=reason, requested_by=os.environ.get("USER")))
    out.print(f"cancel requested for {job_id} (state was {job.get('state')})")


@app.command()
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
        job = _job_or_fail(clients.firestore, job_id)
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


@app.command()
def watch(job_id: str = typer.Argument(...), interval: float = typer.Option(1.0, min=0.2)) -> None:
    """A live view of one job with per-worker state. Exit 0 on success, 1 on failure, 130 on Ctrl-C."""
    import time

    from rich.live import Live

    from tpuq.queries import worker_statuses

    clients = cli_clients()
    try:
        with Live(console=out, refresh_per_second=4, transient=False) as live:
            while True:
                job = _job_or_fail(clients.firestore, job_id)
                statuses = worker_statuses(clients.storage, job, status_bucket=clients.settings.runner_bucket)
                live.update(_watch_view(job, statuses))
                if job.get("state") in TERMINAL_JOB_STATES:
                    break
                time.sleep(interval)
    except KeyboardInterrupt:
        raise typer.Exit(130)
    raise typer.Exit(0 if job.get("state") == JobState.succeeded else 1)


def _watch_view(job: dict, statuses: dict) -> Table:
    from tpuq.tputypes import parse_accelerator_type

    table = Table(title=f"{job['id']}: {job.get('state')}  attempt {job.get('attempt') or 0}  "
                        f"{job.get('tpu') or ''}", title_justify="left")
    table.add_column("worker")
    table.add_column("state")
    table.add_column("exit")
    hosts = 0
    if job.get("tpu_type"):
        hosts = parse_accelerator_type(job["tpu_type"]).hosts
    hosts = max(hosts, len(statuses), 1 if job.get("state") in JOB_STATES_ON_A_TPU else 0)
    for w in range(hosts):
        st = statuses.get(w)
        if st is not None:
            code = st.get("exit_code")
            table.add_row(str(w), "[green]exited[/green]" if code == 0 else "[red]exited[/red]", str(code))
        else:
            table.add_row(str(w), job.get("state") or "", "")
    if job.get("reason"):
        table.caption = job["reason"]
    return table


@fleet_app.callback()
def fleet(ctx: typer.Context, name: Optional[str] = typer.Option(None, help="Fleet name (default: the only one)"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """Queued resources, TPUs, states, idle times and blocked reasons."""
    if ctx.invoked_subcommand is not None:
        return
    from datetime import datetime, timezone

    from tpuq.fleetreport import fleet_view

    clients = cli_clients()
    view = fleet_view(clients.firestore, name, datetime.now(timezone.utc))
    if as_json:
        print(json.dumps(view, default=_json_default, indent=2))
        return
    _print_fleet(view)


def _print_fleet(view: dict) -> None:
    out.print(f"fleet [bold]{view['fleet']}[/bold]")
    for reason in view.get("blocked", []):
        out.print(f"[red]blocked:[/red] {reason}")
    qrs = Table("queued resource", "zone", "type", "state", "note", title="queued resources", title_justify="left")
    for q in view.get("queued_resources", []):
        qrs.add_row(q.get("name", ""), q.get("zone", ""), q.get("type", ""), q.get("state", ""), q.get("note", ""))
    out.print(qrs)
    tpus = Table("tpu", "zone", "type", "state", "job", "idle for", title="TPUs", title_justify="left")
    for t in view.get("tpus", []):
        tpus.add_row(t.get("short", ""), t.get("zone", ""), t.get("type", ""), t.get("state", ""), t.get("job_id") or "",
                     t.get("idle_for", ""))
    out.print(tpus)
    for z in view.get("zones", []):
        out.print(f"zone {z.get('key')}: {z.get('note')}")


@fleet_app.command("unblock")
def fleet_unblock(name: Optional[str] = typer.Option(None, help="Fleet name (default: the only one)")) -> None:
    """After fixing billing or permissions: let the claimer create again (clears the project-level block)."""
    from tpuq import store
    from tpuq.fleetstore import load_fleet

    clients = cli_clients()
    fleet_name = load_fleet(clients.firestore, name).name
    ref = clients.firestore.collection(store.FLEET_STATUS).document(fleet_name)
    snap = ref.get()
    if not snap.exists or not (snap.to_dict() or {}).get("blocked"):
        out.print(f"fleet {fleet_name!r} is not blocked")
        return
    ref.delete()
    out.print(f"fleet {fleet_name!r} unblocked (was: {snap.to_dict()['blocked']})")


@fleet_app.command("apply")
def fleet_apply(file: Path = typer.Argument(..., help="The fleet file")) -> None:
    """Store a fleet file so that the services use it (local stack or deployed project)."""
    from datetime import datetime, timezone

    from tpuq.fleetstore import save_fleet

    model = validate_data(load_yaml_file(file), "fleet")
    version = save_fleet(cli_clients().firestore, model, datetime.now(timezone.utc))
    out.print(f"fleet {model.name!r} stored (version {version})")


# ---------------------------------------------------------------- deploy
@app.command()
def deploy(fleet_file: Path = typer.Argument(..., help="The fleet file (its project is the one deployed to)"),
           dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; change nothing"),
           region: str = typer.Option("us-central1", help="Region of the Cloud Run services, Scheduler job and images"),
           firestore_location: Optional[str] = typer.Option(None, help="Firestore location (default: --region)"),
           image_tag: str = typer.Option("latest", help="Tag of the service images to run (cloudbuild.yaml: $BUILD_ID)"),
           skip_services: bool = typer.Option(False, "--skip-services",
                                              help="Everything but the services and what pushes to them (first pass)"),
           offline: bool = typer.Option(False, "--offline", help="With --dry-run: plan against an empty project, "
                                                                 "without reading it"),
           infra_dir: Optional[Path] = typer.Option(None, help="The infra/ directory (default: the one installed with tpuq)"),
           as_json: bool = typer.Option(False, "--json", help="With --dry-run: print the exact requests, one JSON "
                                                             "object a line: {method, url, query, body}")) -> None:
    """Enable the APIs, then create or update everything in infra/ for the fleet's project, idempotently."""
    from tpuq.deploy.cli import run_deploy

    if as_json and not dry_run:
        raise CliError("--json prints the requests a deploy would send: use it with --dry-run")
    fleet = validate_data(load_yaml_file(fleet_file), "fleet")
    try:
        code = run_deploy(fleet, out, dry_run=dry_run, region=region, firestore_location=firestore_location,
                          image_tag=image_tag, skip_services=skip_services, offline=offline, infra_dir=infra_dir,
                          as_json=as_json)
    except ValueError as e:  # InfraError, a malformed infra/ file
        raise CliError(str(e)) from None
    raise typer.Exit(code)


@app.command()
def undeploy(fleet_file: Path = typer.Argument(..., help="The fleet file that was deployed"),
             purge: bool = typer.Option(False, "--purge", help="Also delete the runner bucket, the image repository "
                                                               "and tpuq's Firestore data"),
             dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be removed; change nothing"),
             region: str = typer.Option("us-central1", help="Region the services were deployed to"),
             yes: bool = typer.Option(False, "--yes", help="Do not ask before removing"),
             as_json: bool = typer.Option(False, "--json", help="With --dry-run: the exact requests, one JSON object a line"),
             infra_dir: Optional[Path] = typer.Option(None, help="The infra/ directory (default: the one installed with tpuq)")) -> None:
    """Remove what `tpuq deploy` created, and nothing it did not; buckets and Firestore data stay unless --purge."""
    import sys

    from tpuq.deploy.cli import adc_available, run_undeploy

    fleet = validate_data(load_yaml_file(fleet_file), "fleet")
    if as_json and not dry_run:
        raise CliError("--json prints the requests an undeploy would send: use it with --dry-run")
    if not (dry_run or yes or sys.stdin.isatty()):
        raise CliError("undeploy removes resources: pass --yes to run it without a prompt (or --dry-run to look first)")
    if not adc_available():
        raise CliError("undeploy reads the project to find what tpuq created: no Google Cloud credentials found "
                       "(run: gcloud auth application-default login)")
    confirm = None if yes else (lambda question: typer.confirm(question, default=False))
    try:
        code = run_undeploy(fleet, out, dry_run=dry_run, purge=purge, region=region, infra_dir=infra_dir,
                            as_json=as_json, confirm=confirm)
    except ValueError as e:  # InfraError, a malformed infra/ file
        raise CliError(str(e)) from None
    raise typer.Exit(code)


# ------------------------------------------------------------------- dev
def _stack(state_dir: Optional[Path] = None):
    from tpuq.devstack.stack import DevStack, default_state_dir

    return DevStack(state_dir=state_dir or default_state_dir())


@dev_app.command("up")
def dev_up(
    state_dir: Optional[Path] = typer.Option(None, help="Where state, logs and env go (default ~/.tpuq/dev or $TPUQ_DEV_DIR)"),
    scenario: Optional[Path] = typer.Option(None, help="Fake Cloud TPU scenario (default: the demo's: 3 v4 zones, one stocked out)"),
    fleet_file: Optional[Path] = typer.Option(None, "--fleet", help="Fleet file to store (default: the demo's fleet)"),
    time_scale: float = typer.Option(60.0, min=1.0, help="Fake TPU scenario seconds per real second"),
    tick_period: float = typer.Option(5.0, min=0.0, help="Seconds between ticks (0: no tick source)"),
    no_tpu: bool = typer.Option(False, "--no-tpu", help="Only the emulators, fake GCS and the services"),
) -> None:
    """Start the local stack in the background on free loopback ports."""
    import time

    from tpuq.devstack.stack import ALL_SERVICES_AVAILABLE, DEMO_DIR

    for path in (scenario, fleet_file):
        if path is not None and not path.is_file():
            raise CliError(f"{path}: no such file")
    if fleet_file is not None:
        validate_data(load_yaml_file(fleet_file), "fleet")
    s = _stack(state_dir)
    s.services = ALL_SERVICES_AVAILABLE()
    if not no_tpu:
        s.scenario = scenario or DEMO_DIR / "scenario.yaml"
        s.fleet_file = fleet_file or DEMO_DIR / "fleet.yaml"
        s.time_scale = time_scale
        s.tick_period = tick_period or None
    started = time.monotonic()
    with err.status("starting the local stack..."):
        s.up()
    out.print(f"local stack ready in {time.monotonic() - started:.1f}s; state in {s.state_dir}")
    out.print('load its environment with:  eval "$(tpuq dev env)"')


@dev_app.command("down")
def dev_down(state_dir: Optional[Path] = typer.Option(None)) -> None:
    """Stop exactly what `tpuq dev up` started."""
    stopped = _stack(state_dir).down()
    out.print(f"stopped {len(stopped)} process{'es' if len(stopped) != 1 else ''}" + (f": {', '.join(stopped)}" if stopped else ""))


@dev_app.command("env")
def dev_env(state_dir: Optional[Path] = typer.Option(None)) -> None:
    """Print the stack's environment as export lines, for eval."""
    import shlex

    from tpuq.devstack.stack import load_env

    for key, value in sorted(load_env(state_dir).items()):
        print(f"export {key}={shlex.quote(value)}")


@dev_app.command("status")
def dev_status(state_dir: Optional[Path] = typer.Option(None), as_json: bool = typer.Option(False, "--json")) -> None:
    """Say what is running."""
    rows = _stack(state_dir).status()
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        out.print("the local stack is not running (start it with `tpuq dev up`)")
        raise typer.Exit(1)
    table = Table("process", "pid", "url", "state")
    for r in rows:
        table.add_row(r["name"], str(r["pid"]), r["url"] or "", "[green]running[/green]" if r["alive"] else "[red]stopped[/red]")
    out.print(table)
    if not all(r["alive"] for r in rows):
        raise typer.Exit(1)


# ------------------------------------------------------------------ main
def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    from tpuq.devstack.stack import StackError

    try:
        rv = app(args=argv, standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        return 130
    except Exception as e:  # noqa: BLE001 - the boundary: one line, no traceback
        if os.environ.get("TPUQ_DEBUG"):
            raise
        import click

        if isinstance(e, click.exceptions.UsageError):
            e.show()
            return 2
        if isinstance(e, click.exceptions.ClickException):
            e.show()
            return e.exit_code
        if isinstance(e, (CliError, StackError, TpuqError)):
            err.print(f"[red]error:[/red] {escape(_one_line(e))}", highlight=False)  # a message's [..] is text
        else:
            err.print(f"[red]error:[/red] {type(e).__name__}: {escape(_one_line(e))}", highlight=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())
