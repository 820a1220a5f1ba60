"""A multislice job (issue 37) published past `tpuq submit` is refused at intake, once, with the field and the reason,
until tpuq claims and runs multislice jobs: stored pending, it would wait for ever (nothing claims or runs a gang).
Delivered twice and concurrently: one rejection, nothing asked, nothing assigned."""

from __future__ import annotations

import os
import subprocess
import threading

from tpuq.contracts import store


def test_a_multislice_job_is_stored_rejected_with_its_reason_and_asks_nothing(sched):
    message = {"id": "gang", "tpu": "v4-32", "slices": [4, 2], "command": "train"}
    threads = [threading.Thread(target=sched.deliver, args=("jobs", message), kwargs={"message_id": "9"})
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sched.deliver("jobs", message, message_id="9")
    job = sched.job("gang")
    assert job["state"] == "rejected" and "multislice jobs are not run yet" in job["reason"]
    letters = list(sched.all(store.DEAD_LETTERS).values())
    assert letters and all(letter["field"] == "slices" for letter in letters)
    assert sched.drain("capacity") == [] and sched.drain("assignments") == []


def test_a_single_slice_job_with_slices_1_is_stored_as_before(sched):
    sched.deliver("jobs", {"id": "one", "tpu": "v4-32", "slices": 1, "command": "train"}, message_id="10")
    job = sched.job("one")
    assert job["state"] == "pending" and "slices" not in job["spec"]


def test_tpuq_submit_refuses_a_multislice_job_before_uploading_anything(tmp_path):
    (tmp_path / "job.yaml").write_text("jobs:\n  - tpu: v4-32\n    command: x\n  - tpu: v4-32\n    slices: 2\n"
                                       "    command: x\n")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_EMULATOR_HOST")}
    r = subprocess.run(["tpuq", "submit", "job.yaml"], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith("error: jobs[1].slices: 2: multislice jobs are not run yet")
    assert "nothing was submitted" in r.stderr
