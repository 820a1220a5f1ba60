"""Environment construction and the per-worker spec."""

from __future__ import annotations

import pytest

from tpuq.contracts.errors import Permanent
from tpuq.executor.workerspec import AttemptPlan, RunnerEnv, WorkerSettings, build_worker_env
from tpuq.contracts.jobspec import ATTEMPT_ENV, RUNNER_ENV

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
    assert set(env) == RUNNER_ENV | {"SEED", "TPUQ_ATTEMPT", "TPUQ_PREEMPTIONS"}  # TPUQ_RESUMING: a first run
    assert env["TPU_WORKER_HOST"] == "10.0.0.3"
    assert env["TPU_WORKER_ID"] == "1"
    assert env["TPU_WORKER_COUNT"] == "2"
    assert env["TPU_WORKER_HOSTNAMES"] == "10.0.0.2,10.0.0.3"


@pytest.mark.parametrize("name", sorted(RUNNER_ENV) + sorted(ATTEMPT_ENV) + ["TPUQ_ATTEMPT_ID", "1BAD", "A-B"])
def test_job_may_not_set_runner_or_reserved_variables(name):
    with pytest.raises(Permanent) as err:
        build_worker_env({name: "x"}, RUNNER)
    assert err.value.field == f"job.env.{name}"


@pytest.mark.parametrize("attempt, preemptions, resuming, expected", [
    (1, 0, False, {"TPUQ_ATTEMPT": "1", "TPUQ_PREEMPTIONS": "0"}),
    (3, 2, True, {"TPUQ_ATTEMPT": "3", "TPUQ_PREEMPTIONS": "2", "TPUQ_RESUMING": "1"}),
    (2, 0, False, {"TPUQ_ATTEMPT": "2", "TPUQ_PREEMPTIONS": "0"}),  # the first attempt never started
])
def test_the_attempt_env_says_where_the_attempt_stands(attempt, preemptions, resuming, expected):
    a = make_assignment(attempt=attempt, preemptions=preemptions, resuming=resuming)
    env = AttemptPlan.from_assignment(a).worker_spec(0, "/home/u", WorkerSettings())["env"]
    assert {k: v for k, v in env.items() if k in ATTEMPT_ENV} == expected


def test_worker_spec_carries_the_notice_urls_graces_and_max_duration():
    spec = AttemptPlan.from_assignment(make_assignment(max_duration="1h30m")).worker_spec(0, "/home/u", WorkerSettings())
    assert spec["preempted_url"].endswith("/computeMetadata/v1/instance/preempted")
    assert spec["maintenance_event_url"].endswith("/computeMetadata/v1/instance/maintenance-event")
    assert (spec["max_duration_seconds"], spec["preemption_grace_seconds"]) == (5400, 25.0)
    local = AttemptPlan.from_assignment(make_assignment()).worker_spec(0, "/home/u",
                                                                      WorkerSettings.for_emulator("http://127.0.0.1:9"))
    # The local stack keeps production's notice URLs: its fake hosts serve them (tests/faketpu/test_host_machine.py).
    assert (local["preempted_url"], local["maintenance_event_url"], local["max_duration_seconds"]) == (
        spec["preempted_url"], spec["maintenance_event_url"], None)


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
