"""A new user's first steps on the local stack, through the CLI alone (issue 16, items 4-8): `tpuq dev up` says what
it started, `tpuq fleet` lists the entries before anything exists, `tpuq init --local` writes a job that runs as it
is, a job no fleet entry can run is refused (or, with --force or from gcloud, stored pending and blocked), and
`tpuq fleet apply` changes the fleet the running services use (the fake Cloud TPU's call log shows it).

The stack is started with `tpuq dev up`, as a person would, with the demo's scenario plus a fourth zone,
us-central2-d, that the demo fleet does not name."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from tests.helpers import Tmux, wait_until, worker_rows
from tpuq_dev.devstack.stack import DEMO_DIR
from tpuq_dev.faketpu.control import FakeTpuControl

DEADLINE = 300  # seconds: generous, for a slow loaded machine; nothing asserts timing
NEW_ZONE = "us-central2-d"


def run(env: dict, *args: str, ok: bool | None = True, timeout: float = DEADLINE) -> subprocess.CompletedProcess:
    done = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=timeout)
    if ok is True:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


class Person:
    """A shell that ran `tpuq dev up` and `eval "$(tpuq dev env)"`."""

    def __init__(self, base_env: dict, up: subprocess.CompletedProcess, tmp: Path):
        self.up, self.tmp = up, tmp
        exported = run(base_env, "tpuq", "dev", "env").stdout
        lines = [line.removeprefix("export ").split("=", 1) for line in exported.splitlines() if line]
        self.env = {**base_env, **{k: v.strip("'") for k, v in lines}}
        self.env.pop("TPUQ_DEBUG", None)

    def tpuq(self, *args: str, ok: bool | None = True) -> subprocess.CompletedProcess:
        return run(self.env, "tpuq", *args, ok=ok)

    def job_file(self, **job) -> Path:
        d = self.tmp / f"job-{uuid.uuid4().hex[:6]}"
        d.mkdir()
        (d / "job.yaml").write_text(yaml.safe_dump({"jobs": [job]}))
        return d / "job.yaml"

    def status(self, job_id: str) -> dict:
        done = self.tpuq("status", job_id, "--json", ok=None)
        return json.loads(done.stdout) if done.returncode == 0 else {}

    def calls(self) -> list[dict]:
        return FakeTpuControl(self.env["TPUQ_TPU_API_ENDPOINT"]).calls(method="POST")


@pytest.fixture(scope="module")
def person(tmp_path_factory):
    tmp = Path(tmp_path_factory.mktemp("first-hour"))
    scenario = yaml.safe_load((DEMO_DIR / "scenario.yaml").read_text())
    scenario["zones"][NEW_ZONE] = {"quota": {"v4": {"spot": 64}}}
    (tmp / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    env = {**os.environ, "TPUQ_DEV_DIR": str(tmp / "dev")}
    for key in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST", "STORAGE_EMULATOR_HOST", "TPUQ_FLEET"):
        env.pop(key, None)  # a fresh shell: only what `tpuq dev env` gives
    up = run(env, "tpuq", "dev", "up", "--scenario", str(tmp / "scenario.yaml"), "--tick-period", "1", ok=None,
             timeout=DEADLINE)
    try:
        assert up.returncode == 0, (up.stdout, up.stderr)
        yield Person(env, up, tmp)
    finally:
        run(env, "tpuq", "dev", "down", ok=None)


def test_dev_up_says_what_it_started_and_fleet_lists_the_entries_before_anything_exists(person):
    said = person.up.stdout
    for line in ("fleet demo",
                 "v4-single: up to 2 x v4-8 (spot) in us-central2-a, us-central2-b, us-central2-c; idle timeout 8 s",
                 "v4-pod: up to 1 x v4-32 (spot) in us-central2-a, us-central2-b, us-central2-c",
                 "zone us-central2-b: v4 stocked out from the start (requests fail)",
                 "zone us-central2-a: quota v4 64 spot chips",
                 f"zone {NEW_ZONE}: quota v4 64 spot chips",
                 "buckets: gs://tpuq-runner, gs://tpuq-demo-us-central2"):
        assert line in said, said
    fleet = person.tpuq("fleet").stdout
    assert "entry v4-single: up to 2 x v4-8 (spot) in us-central2-a, us-central2-b, us-central2-c" in fleet, fleet
    entries = json.loads(person.tpuq("fleet", "--json").stdout)["entries"]
    assert [(e["id"], e["type"], e["count"]) for e in entries] == [("v4-single", "v4-8", 2), ("v4-pod", "v4-32", 1)]


def test_init_local_writes_a_job_that_runs_as_it_is(person):
    d = person.tmp / "d"
    person.tpuq("init", "--local", str(d))
    submitted = person.tpuq("submit", str(d / "job.yaml"), "--wait")
    assert ": succeeded" in submitted.stdout, submitted.stdout
    job_id = submitted.stdout.split("submitted ", 1)[1].split()[0]
    job = person.status(job_id)
    assert job["state"] == "succeeded" and job["job_bucket"] == "gs://tpuq-demo-us-central2", job
    logs = person.tpuq("logs", job_id).stdout
    assert "hello from worker 0 of 1" in logs and "job.yaml" in logs, logs


@pytest.mark.parametrize("job, says", [
    ({"tpu": "v5p-8"}, "no fleet entry offers v5p-8"),
    ({"tpu": "v4-8", "zone": NEW_ZONE}, f"no fleet entry offers v4-8 in zone {NEW_ZONE}"),
])
def test_a_job_no_entry_can_run_is_refused_naming_what_the_fleet_offers(person, job, says):
    job_id = f"never-{uuid.uuid4().hex[:6]}"
    refused = person.tpuq("submit", str(person.job_file(id=job_id, command="true", **job)), ok=None)
    assert refused.returncode == 1, refused.stdout
    line = refused.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert says in line and "fleet demo offers v4-8 in us-central2-a, us-central2-b, us-central2-c; v4-32 in" in line
    assert "--force" in line
    assert person.tpuq("status", job_id, ok=None).returncode != 0  # nothing was sent


def test_a_mistyped_bucket_is_named_first_not_taken_for_a_region_no_entry_offers(person):
    job_id = f"typo-{uuid.uuid4().hex[:6]}"
    refused = person.tpuq("submit", str(person.job_file(id=job_id, tpu="v4-8", command="true",
                                                          buckets=["gs://tpuq-demo-us-centrl2"])),
                          "--force", ok=None)
    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.strip().startswith("error: bucket gs://tpuq-demo-us-centrl2 does not exist"), refused.stderr
    assert "submitted anyway" not in refused.stderr and "no fleet entry" not in refused.stderr
    assert person.tpuq("status", job_id, ok=None).returncode != 0  # nothing was sent


def test_forced_or_published_it_waits_blocked_from_the_first_second(person):
    job_id = f"forced-{uuid.uuid4().hex[:6]}"
    forced = person.tpuq("submit", str(person.job_file(id=job_id, tpu="v5p-8", command="true")), "--force")
    assert "submitted anyway" in forced.stderr
    first = wait_until(lambda: person.status(job_id), timeout=DEADLINE, what=f"{job_id} stored")
    assert first["state"] == "pending"
    assert first["blocked"].startswith("no fleet entry offers v5p-8; fleet demo offers v4-8 in"), first
    shown = person.tpuq("status", job_id).stdout
    assert "blocked: no fleet entry offers v5p-8" in shown, shown
    if shutil.which("gcloud"):  # the same, published on the jobs topic with the real gcloud CLI
        gcloud_env = {**person.env, "CLOUDSDK_CONFIG": str(person.tmp / "gcloud"),
                      "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": f"http://{person.env['PUBSUB_EMULATOR_HOST']}/",
                      "CLOUDSDK_CORE_PROJECT": person.env["GOOGLE_CLOUD_PROJECT"],
                      "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true"}
        published = f"gcloud-{uuid.uuid4().hex[:6]}"
        run(gcloud_env, "gcloud", "pubsub", "topics", "publish", "jobs",
            f"--message={json.dumps({'id': published, 'tpu': 'v5p-8', 'command': 'true'})}")
        first = wait_until(lambda: person.status(published), timeout=DEADLINE, what=f"{published} stored")
        assert first["state"] == "pending" and first["blocked"].startswith("no fleet entry offers v5p-8"), first


def test_fleet_apply_changes_the_fleet_the_services_use(person):
    job_id = f"newzone-{uuid.uuid4().hex[:6]}"
    job_file = person.job_file(id=job_id, tpu="v4-8", zone=NEW_ZONE, command="echo in the new zone")
    person.tpuq("submit", str(job_file), "--force")
    wait_until(lambda: person.status(job_id).get("blocked"), timeout=DEADLINE, what="blocked")
    fleet = yaml.safe_load((DEMO_DIR / "fleet.yaml").read_text())
    fleet["tpus"][0]["zones"].append(NEW_ZONE)
    other = person.tmp / "other-fleet.yaml"
    other.write_text(yaml.safe_dump({**fleet, "name": "other"}))
    refused = person.tpuq("fleet", "apply", str(other), ok=None)
    assert refused.returncode == 1 and "services use fleet 'demo'" in refused.stderr, refused.stderr
    assert "nothing stored" in refused.stderr
    changed = person.tmp / "demo-fleet.yaml"
    changed.write_text(yaml.safe_dump(fleet))
    applied = person.tpuq("fleet", "apply", str(changed))
    assert "the services use it" in applied.stdout
    try:
        done = wait_until(lambda: (j := person.status(job_id)).get("state") in ("succeeded", "failed") and j,
                          timeout=DEADLINE, what=f"{job_id} ended")
        assert done["state"] == "succeeded" and done["zone"] == NEW_ZONE, done
        creates = [c for c in person.calls() if c["path"].endswith("/queuedResources")]
        assert any(f"/locations/{NEW_ZONE}/" in c["path"] for c in creates), [c["path"] for c in creates]
        refused = person.tpuq("submit", str(person.job_file(tpu="v4-8", zone="us-east1-d", command="true")), ok=None)
        assert f"v4-8 in us-central2-a, us-central2-b, us-central2-c, {NEW_ZONE}" in refused.stderr  # the new offer
    finally:
        person.tpuq("fleet", "apply", str(DEMO_DIR / "fleet.yaml"))


TRAIN_SH = """\
#!/bin/sh
# Works until someone stops this worker: `tpuq ssh JOB --worker N -- touch /tmp/STOP` (each worker has its own /tmp).
echo "worker $TPU_WORKER_ID of $TPU_WORKER_COUNT starting"
i=0
while [ ! -e /tmp/STOP ] && [ $i -lt 3600 ]; do i=$((i + 1)); echo "step $i on worker $TPU_WORKER_ID"; sleep 1; done
echo "worker $TPU_WORKER_ID stopped after $i steps"
"""


@pytest.mark.timeout(1200)
def test_the_first_hour_through_the_cli_alone(person):
    """Issue 16's done-when, as the local-stack walk of docs/USING.md tells it, with no Python API: a job of one's own
    on a 4-host slice, watched per worker in a terminal, preempted with `tpuq dev preempt` and run again (issue 35),
    a shell on worker 2, and a refused message published with gcloud found again by its message id."""
    if shutil.which("tmux") is None or shutil.which("gcloud") is None:
        pytest.fail("tmux and gcloud are needed: `make install-system` installs tmux; gcloud is a prerequisite")
    stop = "/tmp/STOP"
    project = person.tmp / "train"
    project.mkdir()
    (project / "train.sh").write_text(TRAIN_SH)
    (project / "job.yaml").write_text(yaml.safe_dump({"jobs": [{
        "name": "walk", "tpu": "v4-32", "bundle": ".", "buckets": ["gs://tpuq-demo-us-central2"],
        "command": "sh train.sh"}]}))
    submitted = person.tpuq("submit", str(project / "job.yaml"))
    job_id = submitted.stdout.split("submitted ", 1)[1].split()[0]

    watch, shell = Tmux({**person.env, "TERM": "xterm"}), Tmux({**person.env, "TERM": "xterm"})
    try:
        watch.type(f"tpuq watch {job_id}; echo watch-exit=$?")
        wait_until(lambda: [words[0] for _, words in sorted(worker_rows(watch.screen()).items())] == ["running"] * 4,
                   timeout=DEADLINE, what="four worker rows, each running, in tpuq watch")
        assert "local stack in " in watch.screen()  # on a terminal, the CLI says where it talks to

        # A spot preemption with its notice (step 4): the job runs again on a fresh slice, and the watch follows it.
        preempted = person.tpuq("dev", "preempt", job_id, "--notice", "3")
        assert "instance/preempted TRUE" in preempted.stdout, preempted.stdout
        wait_until(lambda: (st := person.status(job_id)).get("attempt", 0) >= 2 and st.get("state") == "running",
                   timeout=DEADLINE, what="attempt 2 running on a fresh slice")
        assert person.status(job_id).get("preemptions") == 1
        wait_until(lambda: [words[0] for _, words in sorted(worker_rows(watch.screen()).items())] == ["running"] * 4,
                   timeout=DEADLINE, what="attempt 2's four workers running in tpuq watch")

        # A shell on worker 2: it is that worker's host (its own /tmp), and stopping its work there ends worker 2
        # alone, which the watch shows while the other three still run.
        shell.type(f"tpuq ssh {job_id} --worker 2")
        shell.type(f"touch {stop} && echo stopped-on-$((1 + 1))")
        wait_until(lambda: any(line.split("$ ")[-1] == "stopped-on-2" for line in shell.screen().splitlines()),
                   timeout=DEADLINE, what="the remote shell on worker 2 answering")
        shell.type("exit")
        rows = wait_until(lambda: (r := worker_rows(watch.screen())).get(2, [""])[0] == "succeeded" and r,
                          timeout=DEADLINE, what="worker 2 succeeded in tpuq watch")
        assert rows[2][1] == "0", rows
        assert [rows[w][0] for w in (0, 1, 3)] == ["running"] * 3, rows
        for worker in (0, 1, 3):  # one command each
            person.tpuq("ssh", job_id, "--worker", str(worker), "--", "touch", stop)
        ended = wait_until(lambda: re.search(r"^watch-exit=(\d+)", watch.screen(), re.M), timeout=DEADLINE,
                           what="tpuq watch to end with the job")
        assert ended.group(1) == "0", watch.screen()
    finally:
        watch.kill()
        shell.kill()
    assert person.status(job_id)["state"] == "succeeded"
    logs = person.tpuq("logs", job_id, "--worker", "2").stdout
    assert "[w2] worker 2 stopped after" in logs, logs

    # A refused message published with gcloud, found by the message id gcloud printed.
    gcloud_env = {**person.env, "CLOUDSDK_CONFIG": str(person.tmp / "gcloud-walk"),
                  "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": f"http://{person.env['PUBSUB_EMULATOR_HOST']}/",
                  "CLOUDSDK_CORE_PROJECT": person.env["GOOGLE_CLOUD_PROJECT"]}
    run(gcloud_env, "gcloud", "config", "set", "auth/disable_credentials", "true")
    published = run(gcloud_env, "gcloud", "pubsub", "topics", "publish", "jobs",
                    '--message={"tpu": "v9-8", "command": "true"}')
    message_id = re.search(r"messageIds:\s*-\s*'?(\w+)'?", published.stdout + published.stderr).group(1)
    found = wait_until(lambda: (s := person.tpuq("status", f"job-{message_id}", ok=None)).returncode == 0 and s,
                       timeout=DEADLINE, what=f"tpuq status job-{message_id}")
    assert "refused" in found.stdout and "tpu" in found.stdout and "v9-8" in found.stdout, found.stdout
    letters = person.tpuq("dead-letters", "--topic", "jobs").stdout
    assert message_id in letters and "v9-8" in letters, letters
