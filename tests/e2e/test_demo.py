"""`tpuq demo` ends with every check green, and its summary matches Firestore, GCS and the fake TPU's call log.

The `tpuq demo` command itself (exit 0, the stack stopped) runs from the wheel in a fresh venv:
tests/packaging/test_wheel.py."""

from __future__ import annotations

import json

from rich.console import Console

from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq_dev.demo import run
from tpuq_dev.faketpu.control import FakeTpuControl


def test_demo_summary_matches_the_record(tmp_path):
    result = run(Console(file=open(tmp_path / "demo.out", "w"), width=200), tmp_path / "demo", keep_stack=True)
    stack = result.stack
    try:
        assert result.ok, (tmp_path / "demo.out").read_text()
        clients = Clients(Settings.from_env(stack.env))
        s = result.summary
        for job_id, job in s["jobs"].items():
            stored = clients.firestore.collection(store.JOBS).document(job_id).get().to_dict()
            assert stored["state"] == job["state"] == "succeeded"
            last = stored["attempt"]
            statuses = list(clients.storage.list_blobs(stack.runner_bucket, prefix=f"tpuq/status/{job_id}/{last}/"))
            exit_codes = [json.loads(b.download_as_bytes())["exit_code"] for b in statuses]
            assert exit_codes and all(code == 0 for code in exit_codes)
        pod = next(j for k, j in s["jobs"].items() if k.startswith("pod-"))
        assert max(pod["workers_exit_0"].values()) == 4  # the 4-host slice ran on every worker
        long_job = next(j for k, j in s["jobs"].items() if k.startswith("long-"))
        assert [a["outcome"] for a in long_job["attempts"]][0] == "preempted"
        assert len({a["region"] for a in long_job["attempts"]}) == 1

        calls = FakeTpuControl(stack.env["TPUQ_TPU_API_ENDPOINT"]).calls(method="DELETE")
        deleted = {c["path"].rsplit("/", 1)[-1] for c in calls if "/queuedResources/" in c["path"]}
        assert set(s["race_losers_deleted"]) <= deleted
        assert set(s["used_tpus_deleted"]) <= deleted
        assert s["race_losers_deleted"] and not s["live_tpus"]
    finally:
        stack.down()

