"""Reading one job as it runs, each poll: `tpuq watch`, `tpuq submit --wait` / `--follow` (tpuq.cli.live) and the
dashboard's job page (tpuq.ui.pages).

Each read takes the job (`jobs/{id}`), its current attempt, the `tpus/{node}` document of the node that attempt
runs on, the workers' status objects and new log chunks (GCS, `tpuq.contracts.gcslayout`) and, while the job is pending,
what holds it (`tpuq.operations.fleetreport.annotate_waiting`). `tpuq.operations.jobwatch` decides what that means.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from tpuq.contracts import store
from tpuq.contracts.documents import AttemptDoc, JobDoc, JobState, short_node_name
from tpuq.operations.jobwatch import JobWatch, LineAssembler, build_watch

# A pending job's reason reads every stored fleet's view: at most this often per job.
WAITING_EVERY_SECONDS = 5.0


class JobReader:
    """Reads one job each poll and builds its `JobWatch`. `details`: also the workers' status objects and logs
    (watch, follow); without, the job's own documents only (`--wait`). `on_line(worker, line)` gets every
    complete log line of the current attempt, in order per worker (follow)."""

    def __init__(self, clients, job_id: str, tz, details: bool = True,
                 on_line: Callable[[int, str], None] | None = None) -> None:
        self.clients, self.job_id, self.tz, self.details, self.on_line = clients, job_id, tz, details, on_line
        self._tpus: dict[str, dict[str, Any]] = {}  # node -> its tpus/ document (its type never changes)
        self._waiting: tuple[float, str | None] | None = None  # (when read, the reason)
        self._log_attempt = 0
        self._seen: dict[int, int] = {}  # worker -> the last log chunk read
        self.lines = LineAssembler()

    def read(self, now: datetime) -> JobWatch | None:
        """The job now; None while it is not stored yet (just published: the scheduler has not taken it in)."""
        db = self.clients.firestore
        ref = db.collection(store.JOBS).document(self.job_id)
        snap = ref.get()
        if not snap.exists:
            return None
        stored = snap.to_dict() or {}
        job = JobDoc.from_doc(stored, self.job_id)
        attempt = None
        if job.attempt:
            a = ref.collection(store.ATTEMPTS).document(str(job.attempt)).get()
            attempt = AttemptDoc.from_doc(a.to_dict() or {}, a.id) if a.exists else None
        if job.state is JobState.pending:
            if self.details and self._log_attempt:  # requeued: the ended attempt's last lines may still come
                self._read_attempt_logs(job, self._log_attempt)
            return build_watch(job, attempt, None, {}, {}, self._waiting_reason(stored, now), now)
        self._waiting = None
        node = (attempt.tpu if attempt else None) or job.tpu
        tpu = self._tpu(node) if node else None
        statuses: dict[int, dict[str, Any]] = {}
        if self.details:
            statuses = self._statuses(job)
            self._read_logs(job)
        return build_watch(job, attempt, tpu, statuses, dict(self.lines.latest), None, now)

    def finish(self) -> None:
        """No more chunks will come: hand on the workers' unfinished last lines."""
        for worker, text in self.lines.flush():
            if self.on_line:
                self.on_line(worker, text)

    def _waiting_reason(self, stored: dict[str, Any], now: datetime) -> str | None:
        from tpuq.operations.fleetreport import annotate_waiting

        if self._waiting is None or time.monotonic() - self._waiting[0] >= WAITING_EVERY_SECONDS:
            annotate_waiting(self.clients.firestore, [stored], now, self.tz)
            self._waiting = (time.monotonic(), stored.get("waiting"))
        return self._waiting[1]

    def _tpu(self, node: str) -> dict[str, Any] | None:
        short = short_node_name(node)
        if short not in self._tpus:
            snap = self.clients.firestore.collection(store.TPUS).document(short).get()
            if not snap.exists:
                return None
            self._tpus[short] = snap.to_dict() or {}
        return self._tpus[short]

    def _statuses(self, job: JobDoc) -> dict[int, dict[str, Any]]:
        """The attempt's status objects: the executor writes them to the runner bucket when it has one, else to
        the job's bucket; both are read, so that a CLI that does not know the runner bucket still finds them."""
        from google.api_core.exceptions import Forbidden, NotFound

        from tpuq.operations.queries import worker_statuses

        found: dict[int, dict[str, Any]] = {}
        for bucket in dict.fromkeys((None, self.clients.settings.runner_bucket)):
            try:
                found.update(worker_statuses(self.clients.storage, job, status_bucket=bucket))
            except (NotFound, Forbidden):  # a bucket that is not there, or not ours to read, holds none
                continue
        return found

    def _read_logs(self, job: JobDoc) -> None:
        if job.attempt != self._log_attempt:  # a new attempt: the last one's lines end here, none left unread
            if self._log_attempt:
                self._read_attempt_logs(job, self._log_attempt)
            self.finish()
            self._log_attempt, self._seen, self.lines = job.attempt, {}, LineAssembler()
        self._read_attempt_logs(job, job.attempt)

    def _read_attempt_logs(self, job: JobDoc, attempt: int) -> None:
        """The attempt's log chunks not read yet, its complete lines handed on."""
        from tpuq.operations.queries import worker_log_chunks

        for chunk in worker_log_chunks(self.clients.storage, job, attempt, after=self._seen):
            self._seen[chunk.worker] = chunk.seq
            for line in self.lines.feed(chunk.worker, chunk.text):
                if self.on_line:
                    self.on_line(chunk.worker, line)
