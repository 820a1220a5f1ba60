"""A multislice job's log lines name their worker `[sN/wM]` (tpuq.contracts.workers.worker_label) in `tpuq logs` and
on the dashboard; a single-slice job's stay `[wN]`. The job of tests/unit/test_run_life_views.py and
tests/ui/test_ui_run_life.py, asked on 2 slices of v4-16 (2 hosts each): worker 2 is slice 1's worker 0."""

from __future__ import annotations

from tpuq.contracts import gcslayout, store

from tests.ui.test_ui_run_life import client_of, log_lines, world  # noqa: F401 (fixture)
from tests.unit.test_run_life_views import cli, retried_job  # noqa: F401 (fixture)


def _on_two_slices(db) -> None:
    job = db.collection(store.JOBS).document("train-1")
    job.set({"spec": {**job.get().to_dict()["spec"], "slices": 2}}, merge=True)


def test_tpuq_logs_prefixes_a_multislice_jobs_lines_with_slice_and_worker(cli):
    retried_job(cli.clients)
    cli.clients.storage.put("tpuq-jobs", gcslayout.log_chunk_name("train-1", 2, 2, 0), "attempt 2 worker 2\n")
    assert cli("logs", "train-1").stdout.splitlines()[0] == "[w0] attempt 2 worker 0"  # one slice: as ever
    _on_two_slices(cli.clients.firestore)
    assert cli("logs", "train-1").stdout.splitlines() == [
        "[s0/w0] attempt 2 worker 0", "[s0/w1] attempt 2 worker 1", "[s1/w0] attempt 2 worker 2"]
    # --worker takes the global id: slice 0's node reports 2 workers, the job has 2 x 2.
    cli.clients.firestore.collection(store.TPUS).document("tpuq-two").set(
        {"endpoints": [{"worker_id": w, "ip": f"10.0.0.{w + 2}"} for w in range(2)]})
    assert cli("logs", "train-1", "--worker", "2").stdout.splitlines() == ["[s1/w0] attempt 2 worker 2"]


def test_the_dashboard_prefixes_a_multislice_jobs_lines_with_slice_and_worker(world):  # noqa: F811
    world.storage.chunk(2, 2, 0, "w2 step 1\n", 5)
    _on_two_slices(world.firestore)
    page = client_of(world).get("/jobs/train-1").get_data(as_text=True)
    assert log_lines(page) == ["[s0/w0] w0 step 1", "[s0/w1] w1 step 1", "[s0/w0] w0 step 2", "[s0/w1] w1 step 2",
                               "[s1/w0] w2 step 1"]
    assert 'data-worker="2">worker s1/w0</a>' in page


def test_submit_follow_labels_a_multislice_jobs_workers_the_same_way(cli):
    from tpuq.cli.live import _worker_labels

    retried_job(cli.clients)
    assert _worker_labels(cli.clients, "train-1")(3) == "w3"
    _on_two_slices(cli.clients.firestore)
    assert _worker_labels(cli.clients, "train-1")(3) == "s1/w1"
    assert _worker_labels(cli.clients, "no-such-job")(3) == "w3"
