"""`tpuq submit --follow` and `tpuq watch` (tpuq.operations.jobreader) hand on every line of an attempt that ended:
a preempted worker writes its last lines (a checkpoint saved on SIGTERM) as it stops, while the job is pending
again or once the retry has begun, and those lines come before the retry's. On the documents as the scheduler
stores them and the log chunks as the workers name them; Cloud Storage is a stand-in that lists and reads."""

from __future__ import annotations

from datetime import datetime, timezone

from tpuq.contracts import gcslayout, store
from tpuq.operations.jobreader import JobReader
from tpuq_dev.inmemory import MemoryFirestore

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)
NODE = "projects/tpuq-local/locations/us-central2-b/nodes/tpuq-r-j-1"


class Blob:
    def __init__(self, name: str, data: bytes) -> None:
        self.name, self.data, self.time_created = name, data, NOW

    def download_as_bytes(self) -> bytes:
        return self.data


class Storage:
    """What the reader calls of google-cloud-storage's Client: list_blobs(bucket, prefix) and the blob's bytes."""

    def __init__(self) -> None:
        self.blobs: dict[tuple[str, str], Blob] = {}

    def write(self, attempt: int, worker: int, seq: int, text: str) -> None:
        name = gcslayout.log_chunk_name("j", attempt, worker, seq)
        self.blobs[("job-logs", name)] = Blob(name, text.encode())

    def list_blobs(self, bucket: str, prefix: str = ""):
        return [blob for (b, name), blob in sorted(self.blobs.items()) if b == bucket and name.startswith(prefix)]


class Clients:
    def __init__(self) -> None:
        self.firestore, self.storage = MemoryFirestore(), Storage()
        self.settings = type("Settings", (), {"runner_bucket": None})()

    def job(self, state: str, attempt: int) -> None:
        ref = self.firestore.collection(store.JOBS).document("j")
        ref.set({"id": "j", "state": state, "attempt": attempt, "tpu": NODE, "zone": "us-central2-b",
                 "job_bucket": "gs://job-logs", "submit_time": NOW, "started_at": NOW,
                 "spec": {"tpu": ["v4-8"], "command": "python train.py"}})
        ref.collection(store.ATTEMPTS).document(str(attempt)).set(
            {"attempt": attempt, "state": "running" if state == "running" else "ended", "tpu": NODE,
             "started_at": NOW})


def following(first_chunk: str) -> tuple[Clients, JobReader, list[str]]:
    """A reader that has read attempt 1 running, with worker 0's first chunk: (clients, reader, lines handed on)."""
    clients, printed = Clients(), []
    follow = JobReader(clients, "j", timezone.utc, on_line=lambda w, line: printed.append(f"w{w} {line}"))
    clients.job("running", 1)
    clients.storage.write(1, 0, 0, first_chunk)
    follow.read(NOW)
    return clients, follow, printed


def test_the_ended_attempts_last_lines_come_while_the_job_waits_again():
    clients, follow, printed = following("step 1\nstep 2\n")
    clients.job("pending", 1)  # preempted: requeued, then the stopping worker's last chunk lands
    clients.storage.write(1, 0, 1, "checkpoint saved at step 2\nstopped by SIGTERM\n")
    follow.read(NOW)
    assert printed == ["w0 step 1", "w0 step 2", "w0 checkpoint saved at step 2", "w0 stopped by SIGTERM"]


def test_lines_written_as_the_retry_began_come_before_the_retrys():
    clients, follow, printed = following("step 1\n")
    # Not read while pending: the retry is running at the next poll, and attempt 1's last chunks are there too.
    clients.storage.write(1, 0, 1, "checkpoint saved at step 1\nstopped")
    clients.job("running", 2)
    clients.storage.write(2, 0, 0, "resumed from step 1\n")
    follow.read(NOW)
    assert printed == ["w0 step 1", "w0 checkpoint saved at step 1", "w0 stopped", "w0 resumed from step 1"]
