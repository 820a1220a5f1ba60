"""`tpuq submit` of a file whose `id:` is already a stored job's: one line naming the field, exit 1, nothing sent
(found by a new user: the scheduler refused the file after the CLI had printed "submitted", and `--wait` then
reported the stored job's end as the new one's)."""

from __future__ import annotations

import json
import os
import subprocess

from tpuq.contracts import store
from tpuq_dev.devstack.stack import wait_for


def submit(tmp_path, stack, jobs: list[dict]) -> subprocess.CompletedProcess:
    (tmp_path / "run.sh").write_text("echo hi\n")
    (tmp_path / "job.yaml").write_text(json.dumps({"jobs": jobs}))
    env = {**os.environ, **stack.env}
    env.pop("TPUQ_DEBUG", None)
    return subprocess.run(["tpuq", "submit", str(tmp_path / "job.yaml")], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_job_or_group_id_already_stored_is_refused_before_anything_is_sent(clean_stack, clients, tmp_path):
    jobs = [{"id": "same-1", "tpu": "v4-8", "bundle": ".", "command": "sh run.sh"},
            {"id": "sweep-1", "tpu": "v4-8", "bundle": ".", "command": "sh run.sh", "sweep": {"LR": ["1", "2"]}}]
    first = submit(tmp_path, clean_stack, jobs)
    assert first.returncode == 0, first.stderr
    db = clients.firestore
    wait_for(lambda: db.collection(store.JOBS).document("same-1").get().exists
             and db.collection(store.JOBS).document("sweep-1-1").get().exists, what="both stored")

    again = submit(tmp_path, clean_stack, jobs)
    assert again.returncode == 1 and "submitted" not in again.stdout, again.stdout
    line = " ".join(again.stderr.split())
    assert "jobs[0].id: 'same-1' is already a stored job" in line, line
    assert "jobs[1].id: the group 'sweep-1' is already stored" in line, line
    assert "Nothing was submitted" in line and "Traceback" not in again.stderr
