"""On the whole local stack: 3,000 high-priority v6e jobs wait (the fleet has no v6e), a low-priority v4 job
submitted after them runs as soon as a v4 TPU idles. Before, a pass read the first 2,000 pending jobs in
priority order, all of them v6e, and the v4 job was never offered the TPU."""

from __future__ import annotations

import os
import subprocess
import uuid
from datetime import datetime, timedelta, timezone

from tpuq.contracts import store
from tpuq.contracts.documents import JobState
from tpuq.contracts.jobspec import PublishedJob
from tpuq.scheduler import intake
from tpuq_dev.devstack.stack import wait_for

DEADLINE = 300
WAITING = 3000


def test_a_long_queue_for_a_type_without_capacity_hides_no_runnable_job(system, system_clients, tmp_path):
    db = system_clients.firestore
    tag = uuid.uuid4().hex[:6]
    now = datetime.now(timezone.utc)
    refs = []
    batch = db.batch()
    for i in range(WAITING):  # stored as intake stores them; the fleet offers no v6e, so they stay pending
        job = PublishedJob.model_validate({"id": f"lq-{tag}-{i:05d}", "tpu": "v6e-8", "command": "train",
                                           "priority": "high"})
        ref = db.collection(store.JOBS).document(job.id)
        batch.set(ref, intake.job_document(job, job.id, "cli", f"lq-{tag}-{i}", now - timedelta(seconds=WAITING - i),
                                           blocked="no fleet entry offers v6e-8"))
        refs.append(ref)
        if len(refs) % 500 == 0:
            batch.commit()
            batch = db.batch()
    batch.commit()
    try:
        small = f"lq-small-{tag}"
        spec = tmp_path / "small.yaml"
        spec.write_text(f"id: {small}\ntpu: v4-8\npriority: low\ncommand: echo ran-after-the-queue\n")
        submitted = subprocess.run(["tpuq", "submit", str(spec)], env={**os.environ, **system.env},
                                   capture_output=True, text=True, timeout=DEADLINE)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr

        def finished():
            doc = db.collection(store.JOBS).document(small).get().to_dict() or {}
            return doc if doc.get("state") in {s.value for s in JobState if s.terminal} else None

        done = wait_for(finished, timeout=DEADLINE, what=f"{small} to finish behind {WAITING} v6e jobs")
        assert done["state"] == JobState.succeeded and done["attempts"] == 1, done
        assert (db.collection(store.JOBS).document(refs[-1].id).get().to_dict() or {})["state"] == JobState.pending
    finally:
        for start in range(0, len(refs), 500):  # the session's stack goes on: leave no queue behind
            batch = db.batch()
            for ref in refs[start:start + 500]:
                batch.delete(ref)
            batch.commit()
