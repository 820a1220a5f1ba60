"""Environment construction and the per-worker spec."""

from __future__ import annotations

import pytest

from tpuq.contracts.errors import Permanent
from tpuq.executor.workerspec import AttemptPlan, RunnerEnv, WorkerSettings, build_worker_env
from tpuq.contracts.jobspec import RUNNER_ENV

from .factories import make_assignment

RUNNER = RunnerEnv(
    job_id="j",
    attempt_id="j-a1",
    worker_id=1,
    worker_hosts=("10.0.0.2", "10.0.0.3"),
    job_dir="/home/u/tpuq/job",
    job_bucket="gs://b",
    attempt_gcs_dir="gs://b/tpuq/jobs/j/attempts/1",
    checkpoint_gcs_dir="gs://b/tpuq/jobs/j/checkpoints",
)


def test_runner_env_sets_every_runner_variable():
    env = build_worker_env({"SEED": "1"}, RUNNER)
    assert set(env) == RUNNER_ENV | {"SEED"}
    assert env["TPU_WORKER_HOST"] == "10.0.0.3"
    assert env["TPU_WORKER_ID"] == "1"
    assert env["TPU_WORKER_COUNT"] == "2"
    assert env["TPU_WORKER_HOSTNAMES"] == "10.0.0.2,10.0.0.3"


@pytest.mark.parametrize("name", sorted(RUNNER_ENV) + ["TPUQ_ATTEMPT_ID", "1BAD", "A-B"])
def test_job_may_not_set_runner_or_reserved_variables(name):
    with pytest.raises(Permanent) as err:
        build_worker_env({name: "x"}, RUNNER)
    assert err.value.field == f"job.env.{name}"


def test_values_with_shell_metacharacters_are_kept_verbatim():
    value = "$(rm -rf ~); `id` 'quoted' \"dq\"\nnext line"
    assert build_worker_env({"TRICKY": value}, RUNNER)["TRICKY"] == value


def test_worker_spec_points_at_the_job_bucket_and_worker_paths():
    plan = AttemptPlan.from_assignment(
        make_assignment(hosts=4, bundle="gs://bundles-b/x/b.tar.gz", caches=[{"key": "xla", "path": ".cache/xla"}])
    )
    spec = plan.worker_spec(3, "/home/alice", WorkerSettings.for_emulator("http://127.0.0.1:9"))
    assert spec["job_dir"] == "/home/alice/tpuq/job"
    assert spec["env"]["JOB_DIR"] == "/home/alice/tpuq/job"
    assert spec["env"]["JOB_BUCKET"] == "gs://jobs-us-central2"
    assert spec["env"]["ATTEMPT_GCS_DIR"] == "gs://jobs-us-central2/tpuq/jobs/job-1/attempts/1"
    assert spec["bundle"] == {"bucket": "bundles-b", "object": "x/b.tar.gz"}
    assert spec["gcs"] == {
        "api_base": "http://127.0.0.1:9",
        "token_url": None,
        "bucket": "jobs-us-central2",
        "log_prefix": "tpuq/jobs/job-1/attempts/1/tpuq-logs/worker-3/",
        "status_object": "tpuq/status/job-1/1/worker-3.json",
        "status_bucket": "jobs-us-central2",  # no runner bucket configured: the job's bucket
        "retry_delay_seconds": 0.5,
        "status_deadline_seconds": 900.0,
    }
    runner = plan.worker_spec(3, "/home/alice", WorkerSettings.for_emulator("http://127.0.0.1:9",
                                                                           status_bucket="tpuq-runner"))
    assert runner["gcs"]["status_bucket"] == "tpuq-runner" and runner["gcs"]["bucket"] == "jobs-us-central2"
    assert spec["caches"] == [{"key": "xla", "path": ".cache/xla"}]


def test_assignment_bucket_and_dirs_win_over_defaults():
    a = make_assignment(job_bucket="gs://other-bucket").model_copy(
        update={"attempt_gcs_dir": "gs://x/runs/7", "checkpoint_gcs_dir": "gs://x/ckpt"}
    )
    plan = AttemptPlan.from_assignment(a)
    assert (plan.bucket, plan.attempt_gcs_dir, plan.checkpoint_gcs_dir) == ("other-bucket", "gs://x/runs/7", "gs://x/ckpt")


def test_assignment_without_job_or_with_gaps_in_worker_ids_is_permanent():
    a = make_assignment()
    with pytest.raises(Permanent):
        AttemptPlan.from_assignment(a.model_copy(update={"job": None}))
    with pytest.raises(Permanent, match="0..N-1"):
        AttemptPlan.from_assignment(a.model_copy(update={"endpoints": a.endpoints[1:]}))


def test_log_flush_interval_is_capped_at_five_seconds():
    with pytest.raises(ValueError):
        WorkerSettings(log_flush_seconds=6)
