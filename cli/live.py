"""The live views' shell: `tpuq watch JOB`, `tpuq submit --wait` and `tpuq submit --follow`.

Each poll (tpuq.operations.jobreader.JobReader) reads the job (`jobs/{id}`), its current attempt, the
`tpus/{node}` document of the node that attempt runs on, the workers' status objects and new log chunks (GCS,
`tpuq.contracts.gcslayout`) and, while the job is pending, what holds it (`tpuq.operations.fleetreport.annotate_waiting`, what
`tpuq status` and `tpuq fleet` show). `tpuq.operations.jobwatch` decides what that means. On a terminal `watch` redraws
the view (`tpuq.cli.views.watch_view`); otherwise it prints one line per change. Ctrl-C stops watching, never
the job: it prints how to watch, follow or cancel it, and exits 130.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime, timezone

from tpuq.contracts import store
from tpuq.cli.console import err, out
from tpuq.contracts.documents import JobState
from tpuq.operations.jobwatch import EXIT_DETACHED, JobWatch, change_lines, detach_message, facts, first_line, stamp
from tpuq.operations.jobreader import JobReader


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _local_zone():
    from tpuq.cli.fleet import local_zone

    return local_zone()


def _detached(jobs: dict[str, JobWatch | None]) -> int:
    err.print(detach_message({j: w.state.value if w else None for j, w in jobs.items()}), highlight=False,
              markup=False)
    return EXIT_DETACHED


# A job submitted a moment ago is stored once the scheduler has taken its message in: `tpuq watch` right after
# `tpuq submit` waits this long for it (saying so) before it calls the id unknown.
STORE_GRACE_SECONDS = 60.0


def _await_stored(db, job_id: str, grace: float = STORE_GRACE_SECONDS, poll: float = 0.5) -> bool:
    """Return once the job, or a group of that id, is stored (True: a group); a refused message for it, or neither
    after `grace`, is one line, exit 1."""
    from tpuq.operations import deadletters
    from tpuq.cli.connecting import job_or_fail
    from tpuq.cli.console import CliError
    from tpuq.operations.groups import tasks_if_group

    deadline = time.monotonic() + grace
    said = False
    while not db.collection(store.JOBS).document(job_id).get().exists:
        if tasks_if_group(db, job_id):
            return True
        if deadletters.for_job_id(db, job_id):
            raise CliError(f"job {job_id} was refused, never stored: `tpuq status {job_id}` says why")
        if time.monotonic() > deadline:
            break
        if not said:
            err.print(f"no job {job_id!r} yet: waiting up to {grace:.0f}s in case it was just submitted "
                      "(Ctrl-C stops)", highlight=False, markup=False)
            said = True
        time.sleep(poll)
    job_or_fail(db, job_id)  # an unknown job: one line, exit 1
    return False


def _live_loop(first, read: Callable, drawn: Callable, facts_of: Callable[..., dict[str, str]],
               exit_of: Callable, label: str, interval: float) -> int:
    """A live view's loop, of a job or of a group: from `first`, `read()` every `interval` seconds (None: keep the
    last view) until `exit_of(view)` is not None, the exit status. On a terminal the view is redrawn (`drawn`);
    otherwise each fact (`facts_of`) that changed is one line, stamped and prefixed `label`."""
    view = first
    if out.is_terminal:
        from rich.live import Live

        with Live(drawn(view), console=out, auto_refresh=False, transient=False) as live:
            while exit_of(view) is None:
                time.sleep(interval)
                view = read() or view
                live.update(drawn(view), refresh=True)
        return exit_of(view)
    tz = _local_zone()
    before: dict[str, str] | None = None
    while True:
        after = facts_of(view)
        for line in change_lines(before, after):
            print(f"{stamp(_now(), tz)}  {label}: {line}", flush=True)
        before = after
        if exit_of(view) is not None:
            return exit_of(view)
        time.sleep(interval)
        view = read() or view


def watch_job(clients, job_id: str, interval: float) -> int:
    """`tpuq watch`: until the job ends; its exit status (`jobwatch.job_exit_code`), or 130 on Ctrl-C. A group's
    id: `watch_group`."""
    from tpuq.cli.views import watch_view

    reader = JobReader(clients, job_id, _local_zone())
    latest: dict[str, JobWatch | None] = {job_id: None}  # what Ctrl-C says of the job

    def read() -> JobWatch | None:
        latest[job_id] = reader.read(_now()) or latest[job_id]
        return latest[job_id]

    try:
        if _await_stored(clients.firestore, job_id):
            return watch_group(clients, job_id, interval)
        first = read()
        assert first is not None
        return _live_loop(first, read, watch_view, facts, lambda v: (v.exit_code or 0) if v.terminal else None,
                          job_id, interval)
    except KeyboardInterrupt:
        return _detached(latest)


def watch_group(clients, group: str, interval: float) -> int:
    """`tpuq watch GROUP`: what `tpuq status GROUP` prints (counts by state, a progress bar, the failed tasks
    named), redrawn on a terminal, else a line per change (`groups.watch_facts`), until every task ended; exit 0
    if every task succeeded, else 1 (`groups.group_exit_code`); 130 on Ctrl-C, the tasks keep running."""
    from rich.text import Text

    from tpuq.operations.groups import (group_detach_message, group_exit_code, group_tasks, summary, summary_lines,
                                       watch_facts)

    def read():
        return summary(group, group_tasks(clients.firestore, group))

    try:
        return _live_loop(read(), read, lambda s: Text("\n".join(summary_lines(s))), watch_facts, group_exit_code,
                          group, interval)
    except KeyboardInterrupt:
        err.print(group_detach_message(group), highlight=False, markup=False)
        return EXIT_DETACHED


def _worker_labels(clients, job_id: str) -> Callable[[int], str]:
    """`w3`, or `s1/w0` for a job that asked for several slices (tpuq.contracts.workers)."""
    from tpuq.contracts.documents import JobDoc
    from tpuq.contracts.workers import job_worker_labels

    snap = clients.firestore.collection(store.JOBS).document(job_id).get()
    if not snap.exists:
        return job_worker_labels([], [])
    job = JobDoc.from_doc(snap.to_dict() or {}, job_id)
    return job_worker_labels(job.spec_tpu, job.spec_slice_counts)


def wait_for_jobs(clients, ids: list[str], timeout: float, follow: bool = False, interval: float = 1.0) -> int:
    """`submit --wait` (`follow`: `submit --follow`): until every job ended. Each change of a job's state (pending
    and why, running where, how it ended) is one line on stderr; an ended job's line on stdout. With `follow`, the
    jobs' log lines too, prefixed by worker (and by job when there are several), on stdout.

    Exit status: --wait 0 only if every job succeeded, else 1 (also when `timeout` passed); --follow the first
    job's exit status that is not 0 (`jobwatch.job_exit_code`), else 0. Ctrl-C: 130, the jobs keep running."""
    tz = _local_zone()

    def printer(job_id: str) -> Callable[[int, str], None]:
        labels: list[Callable[[int], str]] = []  # the job's worker labels, read with its first line (stored by then)

        def label(w: int) -> str:
            if not labels:
                labels.append(_worker_labels(clients, job_id))
            return labels[0](w)

        tag = (lambda w: f"[{label(w)}]") if len(ids) == 1 else (lambda w: f"[{job_id} {label(w)}]")
        return lambda worker, line: print(f"{tag(worker)} {line}", flush=True)

    readers = {j: JobReader(clients, j, tz, details=follow, on_line=printer(j) if follow else None) for j in ids}
    deadline = time.monotonic() + timeout if timeout else None
    seen: dict[str, dict[str, str]] = {}
    latest: dict[str, JobWatch | None] = dict.fromkeys(ids)
    ended: dict[str, JobWatch] = {}
    spinner = err.status("waiting for the jobs to end...") if err.is_terminal and not follow else nullcontext()
    try:
        with spinner as status:
            while len(ended) < len(ids):
                for job_id in ids:
                    if job_id in ended:
                        continue
                    view = readers[job_id].read(_now())
                    if view is None:
                        continue  # published; the scheduler stores it in a moment
                    latest[job_id] = view
                    after = facts(view, workers=False)
                    if view.terminal:
                        readers[job_id].finish()
                        ended[job_id] = view
                        reason = first_line(view.reason)
                        out.print(f"{job_id}: {view.state.value}" + (f" ({reason})" if reason and reason !=
                                                                     view.state.value else ""),
                                  highlight=False, markup=False)
                    else:
                        for line in change_lines(seen.get(job_id), after):
                            err.print(f"{stamp(_now(), tz)}  {job_id}: {line}", highlight=False, markup=False)
                    seen[job_id] = after
                if status is not None:
                    status.update(_summary(ids, seen, ended))
                if len(ended) == len(ids):
                    break
                if deadline and time.monotonic() > deadline:
                    err.print(f"gave up waiting after {timeout:.0f}s; the jobs keep running")
                    return 1
                time.sleep(interval)
    except KeyboardInterrupt:
        return _detached({j: w for j, w in latest.items() if j not in ended} or latest)
    if follow:
        return next((v.exit_code for v in (ended[j] for j in ids) if v.exit_code), 0)
    return 0 if all(v.state is JobState.succeeded for v in ended.values()) else 1


def _summary(ids: list[str], seen: dict[str, dict[str, str]], ended: dict[str, JobWatch]) -> str:
    """The spinner's line: `waiting: j1 pending (racing ...), j2 running on ...`."""
    waiting = [f"{j} {seen[j]['job']}" if j in seen else f"{j} not stored yet" for j in ids if j not in ended]
    return "waiting: " + ", ".join(waiting)
