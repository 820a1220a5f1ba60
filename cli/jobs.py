"""The job commands: submit, status, list, cancel, logs, watch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from tpuq.contracts import store
from tpuq.cli.connecting import cli_clients, fleet_in_use, job_or_fail
from tpuq.cli.console import CliError, err, out
from tpuq.cli.files import load_yaml_file, validate_data
from tpuq.cli.views import json_default, print_job, print_job_table
from tpuq.contracts.documents import TERMINAL_JOB_STATES, JobDoc, JobState
from tpuq.operations.jobs import cancel_refusal, change_priority, priority_refusal, request_cancel


def submit(job_file: Path = typer.Argument(..., help="job.yaml"),
           wait: bool = typer.Option(False, "--wait", help="Wait until every job ends, saying what each is doing "
                                                           "(pending and why, running where); exit 1 if one did "
                                                           "not succeed"),
           follow: bool = typer.Option(False, "--follow", "-f", help="Print the jobs' logs (every worker, "
                                                                     "prefixed \\[wN]) until they end; exit with "
                                                                     "the job's status"),
           timeout: float = typer.Option(0, help="With --wait or --follow: give up after this many seconds "
                                                 "(0: never)"),
           job_ids: Optional[list[str]] = typer.Option(None, "--job-id", help="Submit only the job with this id "
                                                       "(repeat for several); a file of one job without an id "
                                                       "gets this id"),
           force: bool = typer.Option(False, "--force", help="Submit even a job no fleet entry can run (it waits, "
                                                             "blocked, until a `tpuq fleet apply` offers its TPU)")) -> None:
    """Bundle the job directory, upload it to each candidate bucket, and publish the jobs."""
    import random

    from tpuq.contracts.arrays import group_tasks
    from tpuq.contracts.bundle import BundleError
    from tpuq.contracts.jobspec import JobFile
    from tpuq.cli.identity import current_owner
    from tpuq.operations.submit import file_indices, prepare, select_jobs, submit_prepared

    whole = validate_data(load_yaml_file(job_file), "job")
    assert isinstance(whole, JobFile)
    try:
        jobs = select_jobs(whole, job_ids or [])
    except ValueError as e:
        raise CliError(str(e)) from None
    clients = cli_clients()
    try:
        prepared = prepare(job_file, jobs, clients.settings.runner_bucket, random.Random(),
                           indices=file_indices(whole, jobs))
    except (BundleError, ValueError) as e:
        raise CliError(str(e)) from None
    if follow and any(p.spec.is_group for p in prepared):
        raise CliError("--follow prints one job's logs: a group's are its tasks' (tpuq logs TASK-ID); use --wait")
    _store_webhook_urls(clients, prepared)
    _check_job_buckets(clients, prepared)  # first: a mistyped bucket also names a region no entry offers
    forced = _check_runnable(clients, prepared, force)
    _check_ids_unused(clients, prepared)
    _check_dependencies(clients, prepared)
    for line in forced:  # said once nothing else stops the submission
        err.print(f"[yellow]warning:[/yellow] {line}; submitted anyway (--force): it waits blocked",
                  highlight=False, markup=True)
    ids = submit_prepared(clients, prepared, owner=current_owner())
    for p, job_id in zip(prepared, ids):
        note = ""
        if p.bundle:
            used = " and ".join(p.bundle.ignore_files) or "no ignore file"
            files = f"{p.bundle.files} file{'s' if p.bundle.files != 1 else ''}"
            note = f" (bundle {p.bundle.sha256[:12]}, {files}; ignore files used: {used})"
        if p.spec.is_group:  # one message; the scheduler stores its tasks (tpuq.contracts.arrays)
            tasks = group_tasks(job_id, p.spec.array, p.spec.sweep)
            note = f": {len(tasks)} tasks {tasks[0].id} ... {tasks[-1].id}{note}"
        out.print(f"submitted [bold]{job_id}[/bold]{note}")
    if wait or follow:
        from tpuq.cli.live import wait_for_jobs

        waited = [t.id for p, job_id in zip(prepared, ids)
                  for t in (group_tasks(job_id, p.spec.array, p.spec.sweep) if p.spec.is_group else [])] + \
                 [job_id for p, job_id in zip(prepared, ids) if not p.spec.is_group]
        raise typer.Exit(wait_for_jobs(clients, waited, timeout, follow=follow))


def _store_webhook_urls(clients, prepared) -> None:
    """Inline `notify: url:` entries go to Secret Manager first: only the secret's name is published."""
    from tpuq.operations.notifysecrets import has_inline_urls, store_inline_urls
    from tpuq.runtime.secretmanager import SecretError, SecretManager

    if not any(has_inline_urls(p.spec.notify) for p in prepared):
        return
    secrets = SecretManager(clients.settings.project, endpoint=clients.settings.secretmanager_endpoint)
    for p in prepared:
        if has_inline_urls(p.spec.notify):
            try:
                p.spec = p.spec.model_copy(update={"notify": store_inline_urls(p.spec.notify, secrets,
                                                                               clients.settings.project)})
            except SecretError as e:
                raise CliError(f"{p.spec.id}: notify: the webhook URL could not be stored in Secret Manager: {e}. "
                               "Nothing was submitted") from None


def _check_runnable(clients, prepared, force: bool) -> list[str]:
    """A job no entry of the stored fleet can run is refused (one line per job), unless --force: then the lines to
    warn with."""
    from datetime import datetime, timezone

    from tpuq.contracts.errors import TpuqError
    from tpuq.runtime.fleetstore import load_fleet

    try:
        fleet = load_fleet(clients.firestore, fleet_in_use())
    except TpuqError:
        return []  # no fleet stored (or several, none chosen): nothing to check against; the scheduler decides
    lines = unrunnable_jobs(prepared, fleet, datetime.now(timezone.utc))
    if lines and not force:
        raise CliError("; ".join(lines) + " (--force submits anyway)")
    return lines


def _check_ids_unused(clients, prepared) -> None:
    """A job whose `id:` a stored job has is refused before anything is uploaded (the scheduler would refuse the
    whole file after "submitted"; `--wait` would then report the stored job's end as this one's)."""
    from tpuq.operations.submit import ids_in_use

    lines = ids_in_use(clients.firestore, prepared)
    if lines:
        raise CliError("; ".join(lines) + ". Nothing was submitted: give each job another `id:`, or leave `id:` "
                       "out for a new one on every submit")


def _check_dependencies(clients, prepared) -> None:
    """A `depends_on` name neither in the file nor stored is refused before anything is uploaded."""
    from tpuq.operations.submit import unknown_dependencies

    lines = unknown_dependencies(clients.firestore, prepared)
    if lines:
        raise CliError("; ".join(lines))


def _check_job_buckets(clients, prepared) -> None:
    """Every bucket must exist (else one line and exit 1); one the workers cannot write is a warning."""
    from tpuq.contracts.fleet import worker_service_account
    from tpuq.operations.submit import check_buckets, storage_bucket_checks

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


def status(job_id: Optional[str] = typer.Argument(None, help="A job id or a group's; omit for the fleet overview"),
           deployment: Optional[Path] = typer.Option(None, "--deployment", hidden=True,
                                                     help="tpu-runner's spelling; tpuq reads the stored fleets"),
           pretty: bool = typer.Option(False, "--pretty", hidden=True, help="tpu-runner's spelling of --json"),
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output"),
           verbose: bool = typer.Option(False, "--verbose", "-v", help="Also the API's own error behind each "
                                                                       "blocked reason")) -> None:
    """One job (state, attempts, reason), or without one the fleet overview: entries, TPUs and queue by state,
    blocked reasons."""
    from datetime import datetime, timezone

    from tpuq.operations.queries import attempts

    clients = cli_clients()
    db = clients.firestore
    if job_id is None:
        from tpuq.cli.fleet import local_zone
        from tpuq.cli.views import print_overview
        from tpuq.operations.fleetreport import status_overview

        if deployment is not None:
            err.print(f"note: --deployment: tpuq shows the fleets stored with `tpuq fleet apply`, not {deployment}")
        view = status_overview(db, datetime.now(timezone.utc), local_zone())
        if as_json or pretty:
            print(json.dumps(view, default=json_default, indent=2))
        else:
            print_overview(view, verbose)
        return
    from tpuq.cli.deadletters import refused_under, status_of_no_job

    from tpuq.operations.deadletters import read_held

    if _status_of_group(db, job_id, as_json or pretty):
        return
    # a refused message (or one Pub/Sub dead-lettered), or a message of several jobs
    if status_of_no_job(db, job_id, as_json or pretty, held=lambda: read_held(clients)):
        return
    job = job_or_fail(db, job_id)
    job["attempt_history"] = attempts(db, job_id)
    _annotate_waiting(db, [job])
    blocks = _fleet_blocks(db) if JobDoc.from_doc(job, job_id).state is JobState.pending else []
    if as_json or pretty:
        job["fleet_blocks"] = [{"reason": reason, "detail": detail} for reason, detail in blocks]
        print(json.dumps(job, default=json_default, indent=2))
        return
    print_job(job_id, job, [reason for reason, _ in blocks], [detail for _, detail in blocks], verbose)
    refused_under(db, job_id, job)


def _status_of_group(db, group: str, as_json: bool) -> bool:
    """`tpuq status GROUP` when the id is no job but a group's (tpuq.operations.groups): counts by state, a progress
    bar, the failed tasks named. True: printed."""
    from dataclasses import asdict

    from tpuq.contracts import store
    from tpuq.operations.groups import group_tasks, summary, summary_lines

    if db.collection(store.JOBS).document(group).get().exists:
        return False
    tasks = group_tasks(db, group)
    if not tasks:
        return False
    found = summary(group, tasks)
    if as_json:
        print(json.dumps(asdict(found) | {"ended": found.ended}, indent=2))
    else:
        out.print("\n".join(summary_lines(found)), markup=False, highlight=False)
    return True


def _group_members(db, job_ids: list[str]) -> list[str]:
    """`tpuq cancel GROUP`: a group's id (no job of its own) stands for its unfinished tasks."""
    from tpuq.contracts import store
    from tpuq.operations.groups import group_tasks, unfinished

    out_ids: list[str] = []
    for job_id in job_ids:
        tasks = [] if db.collection(store.JOBS).document(job_id).get().exists else group_tasks(db, job_id)
        if not tasks:
            out_ids.append(job_id)
            continue
        left = unfinished(tasks)
        out.print(f"group {job_id}: {len(left)} unfinished of {len(tasks)} tasks", highlight=False)
        out_ids += [t["id"] for t in left]
    return out_ids


def _annotate_waiting(db, jobs: list[dict]) -> None:
    """`waiting` on each pending job: what holds it (brakes, back-offs, drops), times in the local zone."""
    from datetime import datetime, timezone

    from tpuq.cli.fleet import local_zone
    from tpuq.operations.fleetreport import annotate_waiting

    annotate_waiting(db, jobs, datetime.now(timezone.utc), local_zone())


def _fleet_blocks(db) -> list[tuple[str, str]]:
    """Project-level blocks the claimer recorded (billing, permission): every waiting job is held by them.
    (reason, the API's own error) each."""
    from tpuq.contracts import store

    docs = [d.to_dict() or {} for d in db.collection(store.FLEET_STATUS).stream()]
    return [(d["blocked"], d.get("blocked_message") or "") for d in docs if d.get("blocked")]


def list_(state: Optional[JobState] = typer.Option(None, "--state", case_sensitive=False,
                                                   help="Only jobs in this state"),
          mine: bool = typer.Option(False, "--mine", help="Only the jobs you submitted (`tpuq config` says who "
                                                          "you are)"),
          limit: int = typer.Option(50, min=1, max=1000),
          as_json: bool = typer.Option(False, "--json", help="Machine-readable output"),
          tasks: bool = typer.Option(False, "--tasks", help="Every task of a group on its own line (else a group "
                                                            "is one line: its counts by state)")) -> None:
    """List recent jobs, newest first."""
    from datetime import datetime, timezone

    from tpuq.cli.identity import current_owner
    from tpuq.operations.queries import list_jobs

    db = cli_clients().firestore
    rows = list_jobs(db, limit=limit, state=state.value if state else None, owner=current_owner() if mine else None)
    if not tasks:
        from tpuq.operations.groups import fold_groups, group_tasks, summary

        groups = sorted({r["group"] for r in rows if r.get("group")})
        rows = fold_groups(rows, {g: summary(g, group_tasks(db, g)) for g in groups})
    _annotate_waiting(db, [r for r in rows if not r.get("group") or tasks])
    if as_json:
        print(json.dumps(rows, default=json_default, indent=2))
        return
    narrowed = " and ".join(([f"in state {state.value}"] if state else []) + (["of yours"] if mine else []))
    now = datetime.now(timezone.utc)
    print_job_table(rows, now, narrowed or None)
    _say_refused_submissions(db, now)


def _say_refused_submissions(db, now) -> None:
    """Submissions refused in the last day (anyone's, whatever `--state` or `--mine`): one refused before it was a job
    (no `id` to store it under, or not JSON) is in no list, so say that some were, and where to read why."""
    from datetime import timedelta

    from tpuq.operations.deadletters import refused_submissions_since

    refused, more = refused_submissions_since(db, now - timedelta(hours=24))
    if refused:
        err.print(f"note: {refused}{' or more' if more else ''} submission{'s were' if refused != 1 else ' was'} "
                  "refused in the last 24 hours (`tpuq dead-letters` says why)", highlight=False, markup=False)


# Exit statuses of cancel and set-priority, as tpu-runner's: 1 an unknown job, 2 a conflict (it started).
EXIT_UNKNOWN, EXIT_CONFLICT = 1, 2


def cancel(job_ids: list[str] = typer.Argument(..., metavar="JOB...", help="One or more job ids, or a group's id "
                                              "(every unfinished task of it)"),
           if_pending: bool = typer.Option(False, "--if-pending",
                                           help="Cancel only jobs that have not started; list the others as skipped"),
           reason: str = typer.Option("cancelled by user"),
           timeout: float = typer.Option(60.0, min=1, help="With --if-pending: seconds to wait for the scheduler"),
           force: bool = typer.Option(False, "--force", help="Cancel jobs someone else submitted, too")) -> None:
    """Cancel jobs: a pending one at once, a running one by stopping it on every worker. With --if-pending, only
    those not started: exit 2 if one was skipped, 1 if one is unknown or someone else's (without --force)."""
    from tpuq.cli.identity import current_owner
    from tpuq.operations.queries import UnknownJob, get_job

    clients = cli_clients()
    db = clients.firestore
    me = current_owner()
    code = 0
    asked: dict[str, int] = {}  # job id -> its attempt count when read (--if-pending)
    for job_id in dict.fromkeys(_group_members(db, job_ids)):
        try:
            job = get_job(db, job_id)
        except UnknownJob as e:
            err.print(f"[red]error:[/red] {e}", highlight=False)
            code = max(code, EXIT_UNKNOWN)
            continue
        state = job.get("state")
        if state in TERMINAL_JOB_STATES:
            out.print(f"{job_id} already ended: {state}")
            continue
        refusal = cancel_refusal(job_id, job.get(JobDoc.field("owner")), me, force)
        if refusal:
            err.print(f"[red]error:[/red] {refusal}", highlight=False)
            code = max(code, EXIT_UNKNOWN)
            continue
        if if_pending and state != JobState.pending:
            out.print(f"skipped {job_id}: it has started (state {state}); tpuq cancel {job_id} stops it")
            code = EXIT_CONFLICT
            continue
        attempt = int(job.get("attempt") or 0)
        request_cancel(clients, job_id, reason, me, if_pending, attempt if if_pending else None)
        if if_pending:
            asked[job_id] = attempt
        else:
            out.print(f"cancel requested for {job_id} (state was {state})")
    if asked and _confirm_if_pending(db, asked, timeout) and not code:
        code = EXIT_CONFLICT
    if code:
        raise typer.Exit(code)


def _confirm_if_pending(db, asked: dict[str, int], timeout: float) -> bool:
    """Wait until the scheduler cancelled each job or it started first; print which. True if one was skipped
    (or not confirmed in time)."""
    import time

    from tpuq.operations.queries import get_job
    from tpuq.contracts.jobstate import still_unstarted

    deadline = time.monotonic() + timeout
    skipped = False
    while asked:
        for job_id, attempt in list(asked.items()):
            job = get_job(db, job_id)
            if job.get("state") == JobState.cancelled:
                out.print(f"cancelled {job_id}")
            elif not still_unstarted(job, attempt):
                out.print(f"skipped {job_id}: it started before the cancel arrived (state {job.get('state')})")
                skipped = True
            else:
                continue
            del asked[job_id]
        if asked and time.monotonic() > deadline:
            for job_id in asked:
                err.print(f"{job_id}: cancel asked, not confirmed by the scheduler after {timeout:.0f}s")
            return True
        if asked:
            time.sleep(0.3)
    return skipped


def set_priority(job_id: str = typer.Argument(..., metavar="JOB", help="A job id, or a group's id (every pending "
                                                                         "task of it)"),
                 priority: str = typer.Argument(..., metavar="low|normal|high")) -> None:
    """Change a pending job's priority; the scheduler re-plans at once. A job that has started keeps its
    priority (exit 2), as in tpu-runner. A group's id: every pending task of it, saying how many changed (exit 2
    when none was pending)."""
    from datetime import datetime, timezone

    from rich.markup import escape

    from tpuq.contracts.jobspec import Priority

    try:
        wanted = Priority(priority)
    except ValueError:
        raise CliError(f"priority: {priority!r} is not one of low, normal, high") from None
    clients = cli_clients()
    _set_group_priority(clients, job_id, wanted)
    result, job = change_priority(clients, job_id, wanted, datetime.now(timezone.utc))
    if result == "unknown":
        raise CliError(f"no job {job_id!r} (tpuq list shows the recent ones)")
    if result == "conflict":
        err.print(f"[red]error:[/red] {escape(priority_refusal(job_id, job))}", highlight=False)
        raise typer.Exit(EXIT_CONFLICT)
    if result == "same":
        out.print(f"{job_id} already has priority {wanted.value}")
        return
    out.print(f"{job_id}: priority {wanted.value} (was {job.get('priority')}); the scheduler re-plans now")


def _set_group_priority(clients, group: str, wanted) -> None:
    """`tpuq set-priority GROUP`: returns only when `group` is no group's id (then it is a job's, or unknown)."""
    from datetime import datetime, timezone

    from tpuq.operations.groups import change_group_priority, priority_line, tasks_if_group

    tasks = tasks_if_group(clients.firestore, group)
    if not tasks:
        return
    tally = change_group_priority(clients, tasks, wanted, datetime.now(timezone.utc))
    out.print(priority_line(group, len(tasks), wanted.value, tally), markup=False, highlight=False)
    raise typer.Exit(0 if tally["changed"] or tally["same"] else EXIT_CONFLICT)


def logs(job_id: str = typer.Argument(...),
         follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing until the job ends"),
         worker: Optional[int] = typer.Option(None, "--worker", min=0, help="Only this worker"),
         attempt: Optional[int] = typer.Option(None, "--attempt", min=1, help="Another attempt than the latest "
                                                                            "(tpuq status JOB lists them)")) -> None:
    """Print a job's logs, each line prefixed by its worker, under a line naming the attempt they are of (on stderr
    when the output is piped, so that the log itself stays clean)."""
    import time

    from tpuq.contracts.workers import job_worker_labels
    from tpuq.operations.queries import worker_log_chunks

    clients = cli_clients()
    try:
        first = JobDoc.from_doc(job_or_fail(clients.firestore, job_id), job_id)
    except CliError:  # no such job: a group's id is said as such (read only then)
        _refuse_group_logs(clients.firestore, job_id)
        raise
    label = job_worker_labels(first.spec_tpu, first.spec_slice_counts)  # [w3], or [s1/w0] on several slices
    if attempt is not None and attempt > max(first.attempts, first.attempt):
        made = max(first.attempts, first.attempt)
        raise CliError(f"job {job_id} has no attempt {attempt}: " +
                       (f"it has had {made} (1 to {made})" if made else "it has not had one yet"))
    if worker is not None:
        _check_log_worker(clients.firestore, first, worker, attempt)
    seen: dict[int, int] = {}
    partial: dict[int, str] = {}
    shown = 0  # the attempt whose lines are being printed

    def print_new(job: JobDoc, n: int) -> None:
        for chunk in worker_log_chunks(clients.storage, job, n, worker, after=seen):
            seen[chunk.worker] = chunk.seq
            text = partial.pop(chunk.worker, "") + chunk.text
            lines = text.split("\n")
            partial[chunk.worker] = lines.pop()  # an unfinished line waits for the next chunk
            for line in lines:
                print(f"[{label(chunk.worker)}] {line}", flush=True)

    while True:
        job = JobDoc.from_doc(job_or_fail(clients.firestore, job_id), job_id)
        n = attempt or job.attempt
        if n and n != shown:  # the first read, or (following the latest) a retry began: its own header, from its start
            if shown:  # the ended attempt's last lines first (written as it stopped, perhaps since the last read)
                print_new(job, shown)
            _flush_partial(partial, label)
            seen, partial, shown = {}, {}, n
            _log_header(clients.firestore, job, n)
        print_new(job, n)
        if not follow or job.terminal:
            break
        time.sleep(1.0)
    _flush_partial(partial, label)
    if not seen and not follow:
        # An attempt that ended (an earlier one, or the job's last) will write no more: "yet" only while it may.
        ended = job.terminal or (attempt is not None and attempt != job.attempt)
        which = f"attempt {attempt} of {job_id}" if attempt else job_id
        err.print(f"no logs for {which}: it wrote none (job {job.state})" if ended
                  else f"no logs yet for {job_id} (state {job.state})")


def _refuse_group_logs(db, some_id: str) -> None:
    """A group's logs are its tasks': a CliError naming them, rather than "no job" for an id `tpuq status` shows.
    Asked once no job has the id."""
    from tpuq.operations.groups import group_tasks

    tasks = [t["id"] for t in group_tasks(db, some_id) if t.get("id")]  # in index order
    if tasks:
        shown = ", ".join(tasks[:4]) + (f", ... ({len(tasks)} in all)" if len(tasks) > 4 else "")
        raise CliError(f"{some_id} is a group: its logs are its tasks' ({shown}); `tpuq logs {tasks[0]}`")


def _flush_partial(partial: dict[int, str], label) -> None:
    for w, rest in sorted(partial.items()):
        if rest:
            print(f"[{label(w)}] {rest}", flush=True)


def _log_header(db, job: JobDoc, n: int) -> None:
    """`attempt 2 of 2 of job X (started 14:01:02 CET on tpuq-abc)` before the lines: on stdout at a terminal, on
    stderr when stdout is piped or redirected, where the log must stay the job's own output."""
    import sys
    from datetime import datetime, timezone

    from tpuq.cli.fleet import local_zone
    from tpuq.contracts.documents import AttemptDoc
    from tpuq.operations.runview import log_header

    snap = db.collection(store.JOBS).document(job.id).collection(store.ATTEMPTS).document(str(n)).get()
    doc = AttemptDoc.from_doc(snap.to_dict() or {}, snap.id) if snap.exists else None
    line = log_header(job.id, n, max(job.attempts, job.attempt, n), doc, local_zone(), datetime.now(timezone.utc))
    print(line, file=sys.stdout if sys.stdout.isatty() else sys.stderr, flush=True)


def _check_log_worker(db, job: JobDoc, worker: int, attempt: Optional[int]) -> None:
    """--worker past the slice's workers is an error naming them (the attempt's TPU: its endpoints, or its type)."""
    from tpuq.contracts.documents import AttemptDoc, short_node_name
    from tpuq.operations.sshaccess import SshRefused, check_worker
    from tpuq.contracts.tputypes import parse_accelerator_type

    node, n, slices = job.tpu, attempt or job.attempt, max(job.spec_slice_counts)
    if n:  # the attempt's own TPU: a retry may have run elsewhere, and an ended job may no longer name one
        snap = db.collection(store.JOBS).document(job.id).collection(store.ATTEMPTS).document(str(n)).get()
        ran = AttemptDoc.from_doc(snap.to_dict() or {}, snap.id) if snap.exists else None
        node = (ran.tpu if ran else None) or node
        slices = len(ran.gang) if ran and ran.gang else slices  # an elastic job: the slices the attempt got
    tpu = db.collection(store.TPUS).document(short_node_name(node)).get().to_dict() if node else None
    if not tpu:
        return  # no TPU known yet: there are no logs to pick from either
    count = len(tpu.get("endpoints") or [])
    if not count and tpu.get("type"):
        count = parse_accelerator_type(tpu["type"]).hosts
    count *= slices  # a multislice job's workers, numbered across its slices (contracts.workers)
    try:
        check_worker(job.id, worker, count)
    except SshRefused as e:
        raise CliError(str(e)) from None


def watch(job_id: str = typer.Argument(..., help="A job id, or a group's id"),
          interval: float = typer.Option(1.0, min=0.2)) -> None:
    """A live view of one job: one row per worker (state, exit code, elapsed time, last log line); while pending,
    why it waits. Not on a terminal: one line per change. Exits when the job ends, with the job's status (0
    succeeded, a failed worker's exit code, else 1); Ctrl-C stops watching (the job keeps running), exit 130.
    A group's id: its tasks' counts by state, a progress bar and the failed tasks named, until every task ended
    (exit 0 if all succeeded, else 1)."""
    from tpuq.cli.live import watch_job

    raise typer.Exit(watch_job(cli_clients(), job_id, interval))


# jobs no fleet entry can run, refused before sending: the scheduler's own rule, asked before anything is sent
def unrunnable_jobs(prepared: list, fleet, now) -> list[str]:
    """One line per job that no entry of `fleet` (the stored fleet file, or None: not known) can ever run, naming
    what the fleet offers; the scheduler would keep such a job pending and blocked with the same reason."""
    from tpuq.operations.submit import entry_name
    from tpuq.scheduler.capacity import unrunnable_reason
    from tpuq.scheduler.plan import PendingJob

    lines = []
    for p in prepared:
        reason = unrunnable_reason(PendingJob.from_spec(p.spec, now), fleet)
        if reason:
            lines.append(f"{entry_name(p)}: {reason}")
    return lines
