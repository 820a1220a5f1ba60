"""The worker supervisor, as the executor ships it (one bundled file), run as a subprocess with a temp dir
as the worker's home and a fake GCS.

Outcomes are asserted on files in the "host" and objects in GCS; every wait is a
poll with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tpuq.contracts import gcslayout
from tpuq.executor.supervisor_bundle import build_supervisor_script
from tpuq.executor.worker.control import bootstrap_argv
from tpuq.executor.worker.files import read_json
from tpuq.executor.worker.processes import lock_is_held
from tpuq.executor.workerspec import AttemptPlan, WorkerSettings

from .conftest import wait_until
from .factories import make_assignment, upload_bundle

WORKER_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


class Worker:
    """One fake worker: a home directory and the supervisor script run against it."""

    def __init__(self, script: Path, home: Path, gcs, lockfile: Path):
        self.script = script
        self.home = home
        self.gcs = gcs
        self.settings = WorkerSettings.for_emulator(
            gcs.base_url, libtpu_lockfile=str(lockfile), log_flush_seconds=0.2,
            cancel_grace_seconds=1.0, stale_grace_seconds=1.0, gcs_retry_delay_seconds=0.01,
            # This supervisor runs on the machine itself, not on a fake host: no metadata server of a TPU VM here.
            preempted_url=None, maintenance_event_url=None,
            # Nor its /proc: its TPU devices are files of its own, so that the preflight never sees a fake worker
            # host's device held by another test (`tpuq dev dirty`) in the machine's /proc.
            tpu_device_globs=(f"{home.parent}/dev/accel*", f"{home.parent}/dev/vfio/*"),
        )
        home.mkdir(parents=True, exist_ok=True)

    def run(self, *args: str, stdin: str = "") -> dict:
        out = subprocess.run(
            bootstrap_argv(WORKER_PYTHON, str(self.script), "--home", str(self.home), *args),
            input=stdin, capture_output=True, text=True, timeout=60,
        )
        assert out.stdout, f"no output from {args}: {out.stderr}"
        return json.loads(out.stdout)

    def spec(self, assignment, worker_id: int = 0) -> dict:
        return AttemptPlan.from_assignment(assignment).worker_spec(worker_id, str(self.home), self.settings)

    def prepare(self, assignment, worker_id: int = 0) -> dict:
        return self.run("prepare", stdin=json.dumps(self.spec(assignment, worker_id)))

    def start(self, assignment, worker_id: int = 0) -> dict:
        prepared = self.prepare(assignment, worker_id)
        assert prepared["ok"], prepared
        launched = self.run("launch", "--attempt-id", assignment.attempt_id)
        assert launched["ok"], launched
        return launched

    def status_object(self, bucket: str, assignment, worker_id: int = 0) -> dict | None:
        return self.gcs.read_json(bucket, gcslayout.worker_status_name(assignment.job_id, assignment.attempt, worker_id))

    def wait_status(self, bucket: str, assignment, worker_id: int = 0) -> dict:
        return wait_until(lambda: self.status_object(bucket, assignment, worker_id), 20, "the status object")

    def kill_everything(self) -> None:
        """Test teardown: stop the supervisor and job this worker's state file names, while their flocks say they
        live (a pid from a finished attempt may be another test's process by now)."""
        attempt = self.home / "tpuq/attempt"
        state = read_json(str(attempt / "state.json")) or {}
        alive = {"job_pgid": lock_is_held(str(attempt / "job.lock")),
                 "supervisor_pid": lock_is_held(str(attempt / "supervisor.lock"))}
        for pgid in [state.get(key) for key, held in alive.items() if held]:
            if pgid:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


@pytest.fixture(scope="module")
def supervisor_script(tmp_path_factory) -> Path:
    """The bundle the executor copies to ~/tpuq/supervisor.py, at that name in a directory of its own."""
    script = tmp_path_factory.mktemp("worker-bin") / Path(gcslayout.WORKER_SUPERVISOR).name
    script.write_bytes(build_supervisor_script())
    return script


@pytest.fixture
def worker(supervisor_script, tmp_path, fake_gcs):
    w = Worker(supervisor_script, tmp_path / "home", fake_gcs, tmp_path / "libtpu_lockfile")
    yield w
    w.kill_everything()


def test_job_runs_with_its_env_and_bundle_and_reports_logs_and_status(worker, fake_gcs, bucket):
    tricky = "$(touch pwned) `id`; 'q' \"dq\""
    bundle = upload_bundle(fake_gcs, bucket, {"run.sh": b"echo out-line; echo err-line >&2; env > env.txt\n"})
    a = make_assignment(command="sh run.sh", env={"TRICKY": tricky}, bundle=bundle, bucket=bucket)
    worker.start(a)

    status = worker.wait_status(bucket, a)
    assert (status["exit_code"], status["phase"], status["cancelled"]) == (0, "run", False)
    job_dir = worker.home / "tpuq/job"
    env = dict(line.split("=", 1) for line in (job_dir / "env.txt").read_text().splitlines() if "=" in line)
    assert env["TRICKY"] == tricky
    assert not (job_dir / "pwned").exists()
    assert env["JOB_DIR"] == str(job_dir)
    assert env["TPU_WORKER_HOSTNAMES"] == "10.0.0.2,10.0.0.3"
    assert env["TPUQ_ATTEMPT_ID"] == a.attempt_id
    logs = fake_gcs.log_text(bucket, gcslayout.worker_log_prefix(a.job_id, a.attempt, 0))
    assert "out-line" in logs and "err-line" in logs
    assert "out-line" in status["tail"]
    assert status["log_chunks"] >= 1 and status["disk"]["total_bytes"] > 0


def test_logs_reach_gcs_while_the_job_is_still_running(worker, fake_gcs, bucket, tmp_path):
    go = tmp_path / "go"
    a = make_assignment(command=f"echo first-line; while [ ! -e {go} ]; do sleep 0.05; done; echo second-line",
                        bucket=bucket)
    worker.start(a)
    prefix = gcslayout.worker_log_prefix(a.job_id, a.attempt, 0)
    wait_until(lambda: "first-line" in fake_gcs.log_text(bucket, prefix), 10, "the first log chunk")
    assert worker.status_object(bucket, a) is None  # still running
    go.touch()
    status = worker.wait_status(bucket, a)
    assert status["exit_code"] == 0
    assert fake_gcs.log_text(bucket, prefix).endswith("second-line\n")


def test_non_zero_exit_is_recorded(worker, bucket):
    a = make_assignment(command="echo boom; exit 3", bucket=bucket)
    worker.start(a)
    status = worker.wait_status(bucket, a)
    assert status["exit_code"] == 3 and "boom" in status["tail"]


def test_background_children_do_not_keep_the_attempt_alive(worker, bucket):
    a = make_assignment(command="sleep 300 & echo started", bucket=bucket)
    worker.start(a)
    status = worker.wait_status(bucket, a)
    assert status["exit_code"] == 0
    assert worker.run("status")["job_alive"] is False


def test_cancel_terms_then_kills_the_group(worker, bucket):
    a = make_assignment(command="trap '' TERM; echo ready; sleep 300", bucket=bucket)
    worker.start(a)
    assert worker.run("cancel", "--attempt-id", a.attempt_id, "--reason", "user asked", "--grace", "0.5")["state"] == "signalled"
    status = worker.wait_status(bucket, a)
    assert status["cancelled"] is True and status["cancel_reason"] == "user asked"
    assert (status["exit_code"], status["signal"]) == (128 + 9, "SIGKILL")


def test_cancel_of_another_attempt_does_nothing(worker, bucket):
    a = make_assignment(command="echo hi", bucket=bucket)
    worker.start(a)
    assert worker.run("cancel", "--attempt-id", "someone-else")["state"] == "not_current"
    assert worker.wait_status(bucket, a)["cancelled"] is False


@pytest.mark.parametrize("steps", ["start", "prepare-then-launch"])
def test_the_detached_supervisor_keeps_nothing_of_the_command_that_started_it(worker, bucket, steps):
    """The supervisor is a fork of `start` (or `launch`): it must leave that command's SSH channel (its stdout
    reaches EOF while the job runs: the executor's exec returns), have a session of its own, and not hold the
    control lock the next `prepare` waits for."""
    a = make_assignment(command="echo running; sleep 300", bucket=bucket)
    if steps == "start":
        answer = worker.run("start", "--attempt-id", a.attempt_id, stdin=json.dumps(worker.spec(a)))
        state = answer["launched"]["state"]
    else:
        state = worker.start(a)["state"]
    pid = state["supervisor_pid"]
    attempt = worker.home / "tpuq/attempt"
    assert lock_is_held(str(attempt / "supervisor.lock")) and lock_is_held(str(attempt / "job.lock"))
    assert os.getsid(pid) == pid
    fds = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert (fds[0], fds[1], fds[2]) == (os.devnull, str(attempt / "supervisor.err"), str(attempt / "supervisor.err"))
    assert str(worker.home / ".tpuq-control.lock") not in fds.values()
    assert not lock_is_held(str(worker.home / ".tpuq-control.lock"))
    assert not any(target.startswith(("pipe:", "socket:")) and fd < 3 for fd, target in fds.items())


def test_new_attempt_stops_the_old_one_and_replaces_the_workspace(worker, fake_gcs, bucket):
    first = make_assignment(attempt=1, command="echo old > marker; sleep 300", bucket=bucket)
    worker.start(first)
    wait_until(lambda: (worker.home / "tpuq/job/marker").exists(), 10, "the first attempt's marker")
    bundle = upload_bundle(fake_gcs, bucket, {"new.txt": b"new"})
    second = make_assignment(attempt=2, command="cat new.txt", bundle=bundle, bucket=bucket)

    prepared = worker.prepare(second)
    assert prepared["ok"], prepared
    assert any("stopping attempt job-1-a1" in n for n in prepared["notes"])
    assert not (worker.home / "tpuq/job/marker").exists()
    assert (worker.home / "tpuq/job/new.txt").read_text() == "new"
    old_status = worker.wait_status(bucket, first)  # the old supervisor still reported, once
    assert old_status["cancelled"] is True and "superseded" in old_status["cancel_reason"]

    worker.run("launch", "--attempt-id", second.attempt_id)
    assert worker.wait_status(bucket, second)["exit_code"] == 0


def test_redelivered_assignment_does_not_restart_the_attempt(worker, bucket, tmp_path):
    go = tmp_path / "go"
    a = make_assignment(command=f"echo $$ >> pids; while [ ! -e {go} ]; do sleep 0.05; done", bucket=bucket)
    worker.start(a)
    assert worker.prepare(a) == {"ok": True, "already": True, "notes": []}
    assert worker.run("launch", "--attempt-id", a.attempt_id)["already"] is True
    go.touch()
    worker.wait_status(bucket, a)
    assert len((worker.home / "tpuq/job/pids").read_text().split()) == 1


def test_two_deliveries_at_once_start_the_attempt_once_and_both_succeed(worker, fake_gcs, bucket, tmp_path):
    """Pub/Sub may push one assignment twice at the same moment (the chaos soak does): both deliveries' prepare
    and launch run side by side on the worker. Neither may remove the other's workspace or fail, and the command
    runs once."""
    from concurrent.futures import ThreadPoolExecutor

    go = tmp_path / "go"
    bundle = upload_bundle(fake_gcs, bucket, {f"data/{i}.txt": b"x" * 20_000 for i in range(40)})
    for round_ in range(3):
        a = make_assignment(job_id=f"twice-{round_}", command=f"echo $$ >> pids; while [ ! -e {go} ]; do sleep 0.05; "
                                                             "done", bucket=bucket, bundle=bundle)

        def deliver(_):
            prepared = worker.prepare(a)
            return prepared, worker.run("launch", "--attempt-id", a.attempt_id) if prepared["ok"] else None

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(deliver, range(2)))
        assert all(p["ok"] and launched and launched["ok"] for p, launched in results), results
        assert sorted(bool(launched.get("already")) for _, launched in results) == [False, True], results
        go.touch()
        worker.wait_status(bucket, a)
        assert len((worker.home / "tpuq/job/pids").read_text().split()) == 1
        go.unlink()


def test_caches_kept_only_when_declared_and_ready(worker, bucket):
    caches = worker.home / "tpuq-cache"
    for key, ready in (("keep", True), ("partial", False), ("undeclared", True)):
        (caches / key).mkdir(parents=True)
        (caches / key / "data").write_text(key)
        if ready:
            (caches / key / ".ready").write_text("x")
    a = make_assignment(
        command="ls .cache/keep > seen.txt; echo new > .cache/partial/data2",
        caches=[{"key": "keep", "path": ".cache/keep"}, {"key": "partial", "path": ".cache/partial"},
                {"key": "fresh", "path": "fresh"}],
        bucket=bucket,
    )
    prepared = worker.prepare(a)
    assert prepared["ok"], prepared
    assert sorted(p.name for p in caches.iterdir()) == ["fresh", "keep", "partial"]
    assert (caches / "keep/data").read_text() == "keep"
    assert list((caches / "partial").iterdir()) == []
    job_dir = worker.home / "tpuq/job"
    assert os.readlink(job_dir / ".cache/keep") == str(caches / "keep")

    worker.run("launch", "--attempt-id", a.attempt_id)
    assert worker.wait_status(bucket, a)["exit_code"] == 0
    assert (job_dir / "seen.txt").read_text().split() == ["data"]
    assert (caches / "partial/data2").read_text() == "new\n"
    assert all((caches / k / ".ready").exists() for k in ("keep", "partial", "fresh"))


def test_failed_job_does_not_mark_caches_ready(worker, bucket):
    a = make_assignment(command="exit 1", caches=[{"key": "c", "path": "c"}], bucket=bucket)
    worker.start(a)
    worker.wait_status(bucket, a)
    assert not (worker.home / "tpuq-cache/c/.ready").exists()


def test_stale_libtpu_lockfile_is_removed_but_a_held_one_is_kept_and_fails_the_preflight(worker, bucket, tmp_path):
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.write_text("")
    a = make_assignment(bucket=bucket)
    assert "removed stale" in " ".join(worker.prepare(a)["notes"])
    assert not lockfile.exists()

    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDWR|os.O_CREAT); fcntl.lockf(fd, fcntl.LOCK_EX);"
         " print('locked', flush=True); sys.stdin.read()", str(lockfile)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        prepared = worker.prepare(make_assignment(attempt=2, bucket=bucket))
        # Held by a live process: libtpu's lockf would fail ("The TPU is already in use by process with pid N"), so
        # the host is unfit (tpuq.executor.worker.preflight), and the file is left to its holder.
        assert (prepared["ok"], prepared["kind"]) == (False, "preflight")
        assert prepared["reason"].startswith(f"libtpu's lock file {lockfile} is locked by pid {holder.pid} (")
        assert lockfile.exists()
    finally:
        holder.stdin.close()
        holder.wait(10)


def _missing_bundle(gcs, bucket):
    return f"gs://{bucket}/bundles/nope.tar.gz", []


def _unsafe_bundle(gcs, bucket):
    evil = tarfile.TarInfo("escape")
    evil.type, evil.linkname = tarfile.SYMTYPE, "../../../etc"
    return upload_bundle(gcs, bucket, {"ok.txt": b"x"}, extra=[evil]), []


def _bundle_that_is_not_a_tar(gcs, bucket):
    gcs.upload(bucket, "bundles/junk", b"not a tar")
    return f"gs://{bucket}/bundles/junk", []


def _bundle_colliding_with_a_cache_path(gcs, bucket):
    return upload_bundle(gcs, bucket, {"cache/x": b"x"}), [{"key": "k", "path": "cache"}]


@pytest.mark.parametrize(
    "bundle_and_caches",
    [_missing_bundle, _unsafe_bundle, _bundle_that_is_not_a_tar, _bundle_colliding_with_a_cache_path],
    ids=["missing", "unsafe", "not-a-tar", "cache-collides"],
)
def test_setup_failures_write_a_setup_status_and_launch_nothing(worker, fake_gcs, bucket, bundle_and_caches):
    bundle, caches = bundle_and_caches(fake_gcs, bucket)
    a = make_assignment(bundle=bundle, bucket=bucket, caches=caches)
    result = worker.prepare(a)
    assert (result["ok"], result["kind"]) == (False, "setup")
    status = worker.status_object(bucket, a)
    assert status["phase"] == "setup" and status["setup_error"] == result["reason"]
    assert worker.run("launch", "--attempt-id", a.attempt_id)["ok"] is False


def test_unreachable_gcs_for_the_bundle_is_an_infra_failure(worker, bucket, tmp_path):
    spec = worker.spec(make_assignment(bundle=f"gs://{bucket}/b.tgz", bucket=bucket))
    with socket_closed_port() as port:
        spec["gcs"]["api_base"] = f"http://127.0.0.1:{port}"
        result = worker.run("prepare", stdin=json.dumps(spec))
    assert (result["ok"], result["kind"]) == (False, "infra")


class socket_closed_port:
    """A local port with nothing listening (bound, never listened on)."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return self._sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self._sock.close()


def test_status_reports_a_supervisor_that_is_gone(worker, bucket):
    a = make_assignment(command="sleep 300", bucket=bucket)
    launched = worker.start(a)
    probe = worker.run("status", "--attempt-id", a.attempt_id)
    assert probe["supervisor_alive"] and probe["job_alive"]
    # A host restart: every process dies, the files stay.
    worker.kill_everything()
    wait_until(lambda: not worker.run("status")["supervisor_alive"], 10, "the supervisor to die")
    # The job's group and the supervisor die apart (two kills): the job's lock is let go when its own processes exit.
    probe = wait_until(lambda: (p := worker.run("status", "--attempt-id", a.attempt_id)) and not p["job_alive"] and p,
                       10, "the job to die too")
    assert (probe["supervisor_alive"], probe["job_alive"], probe["status"]) == (False, False, None)
    assert launched["state"]["job_pgid"] > 0
