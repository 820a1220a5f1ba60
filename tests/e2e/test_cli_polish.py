"""The CLI as a new user meets it (issue 16, items 13-15 and 17), through `tpuq` subprocesses on the session's
local stack: where it talks to (a dim line, `tpuq config`), who submitted a job (`owner`: `status`, `list --mine`,
`cancel` of someone else's job needs --force, an `owner` attribute from gcloud), `list --json` / `--state`, times
with their zone, tables that keep names whole when piped, no Python warning on the terminal, and a shell holding
an earlier stack's `dev env`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest
import yaml

from tests.helpers import wait_until
from tpuq.contracts import store
from tpuq.operations.stackenv import ENV_STACK_ID

DEADLINE = 240  # seconds: for a slow loaded machine; nothing asserts timing
# A warning that reaches the terminal fails the command: it becomes an error (exit 1, "error: UserWarning: ...").
STRICT = {"PYTHONWARNINGS": "error::UserWarning", "TZ": "Europe/Paris"}


def tpuq(system, *args, ok: bool | None = True, **env):
    full = {**os.environ, **system.env, **STRICT, **env}
    full.pop("TPUQ_DEBUG", None)
    done = subprocess.run(["tpuq", *args], env=full, capture_output=True, text=True, timeout=DEADLINE)
    if ok:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    assert "Warning" not in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    return done


def job_file(tmp_path, **job):
    d = tmp_path / f"job-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    (d / "job.yaml").write_text(yaml.safe_dump({"jobs": [job]}))
    return str(d / "job.yaml")


def stored(system_clients, job_id: str) -> dict:
    snap = system_clients.firestore.collection(store.JOBS).document(job_id).get()
    return snap.to_dict() if snap.exists else {}


# About 20 `tpuq` processes, each importing the Google clients: minutes on a loaded 2-core machine, more than the
# suite-wide 300 s.
@pytest.mark.timeout(900)
def test_where_whose_and_how_jobs_are_shown(system, system_clients, tmp_path):
    # Where: one dim line on stderr when it is a terminal (the first-hour walk sees it in tmux), `tpuq config` in full.
    config = json.loads(tpuq(system, "config", "--json", TPUQ_OWNER="alice").stdout)
    assert config["backend"] == "local stack" and config["project"] == system.env["GOOGLE_CLOUD_PROJECT"]
    assert config["runner_bucket"] == "gs://tpuq-runner" and config["runner_bucket_source"] == "TPUQ_RUNNER_BUCKET"
    assert config["fleet"] == "demo" and config["emulators"]["FIRESTORE_EMULATOR_HOST"]
    assert config["owner"] == "alice"  # the local stack has no credentials: $TPUQ_OWNER, else the OS user
    human = tpuq(system, "config", TPUQ_OWNER="alice").stdout
    assert "backend: local stack in" in human and "owner of the jobs you submit: alice" in human, human

    # Whose: alice submits; the job records her, `status` shows her and its times with their zone.
    mine = f"polish-{uuid.uuid4().hex[:6]}"
    done = tpuq(system, "submit", job_file(tmp_path, id=mine, tpu="v4-8", buckets=["gs://tpuq-demo-us-central2"],
                                           command="echo hello"), "--wait", TPUQ_OWNER="alice")
    assert f"{mine}: succeeded" in done.stdout and "local stack in" not in done.stderr, done  # a terminal's line
    assert stored(system_clients, mine)["owner"] == "alice"
    status = tpuq(system, "status", mine).stdout
    assert "owner: alice" in status and "submitted " in status, status
    assert " CET" in status or " CEST" in status, status  # TZ=Europe/Paris: local time with its zone
    assert "reason: succeeded" not in status and "the 1 worker exited 0" in status, status

    # A job someone else (bob) submitted, which waits (no fleet entry offers v5p-8).
    theirs = f"polish-bob-{uuid.uuid4().hex[:6]}"
    tpuq(system, "submit", job_file(tmp_path, id=theirs, tpu="v5p-8", buckets=["gs://tpuq-demo-us-central2"],
                                    command="true"), "--force", TPUQ_OWNER="bob")
    wait_until(lambda: stored(system_clients, theirs).get("state"), timeout=DEADLINE, what=f"{theirs} stored")

    listed = {r["id"]: r for r in json.loads(tpuq(system, "list", "--json", TPUQ_OWNER="alice").stdout)}
    assert listed[mine]["owner"] == "alice" and listed[theirs]["owner"] == "bob"
    alices = [r["id"] for r in json.loads(tpuq(system, "list", "--mine", "--json", TPUQ_OWNER="alice").stdout)]
    assert mine in alices and theirs not in alices
    assert [r["id"] for r in json.loads(tpuq(system, "list", "--mine", "--state", "pending", "--json",
                                             TPUQ_OWNER="bob").stdout)] == [theirs]

    # Piped, the table is plain text: each job on one line, its id and owner whole.
    table = tpuq(system, "list", "--state", "succeeded", "--mine", TPUQ_OWNER="alice").stdout.splitlines()
    assert table[0].split() == ["job", "state", "priority", "tpu", "owner", "age", "reason"], table
    row = next(line for line in table if line.startswith(mine + " "))
    assert row.split()[:5] == [mine, "succeeded", "normal", "v4-8", "alice"], row

    # An unknown state is a usage error naming the valid ones.
    bogus = tpuq(system, "list", "--state", "finished", ok=False)
    assert bogus.returncode == 2 and "'finished' is not one of" in bogus.stderr and "'succeeded'" in bogus.stderr

    # Cancelling bob's job as alice needs --force: one line, nothing published.
    refused = tpuq(system, "cancel", theirs, ok=False, TPUQ_OWNER="alice")
    assert refused.returncode == 1 and f"tpuq cancel --force {theirs}" in refused.stderr and "bob" in refused.stderr
    assert stored(system_clients, theirs)["state"] == "pending"
    tpuq(system, "cancel", theirs, "--force", TPUQ_OWNER="alice")
    wait_until(lambda: stored(system_clients, theirs).get("state") == "cancelled", timeout=DEADLINE,
               what=f"{theirs} cancelled")

    # gcloud: an `owner` attribute on the message is the job's owner (Pub/Sub itself says nothing of the publisher).
    if shutil.which("gcloud"):
        published = f"polish-gcloud-{uuid.uuid4().hex[:6]}"
        gcloud_env = {**os.environ, **system.env, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
                      "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": f"http://{system.env['PUBSUB_EMULATOR_HOST']}/",
                      "CLOUDSDK_CORE_PROJECT": system.env["GOOGLE_CLOUD_PROJECT"],
                      "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true"}
        subprocess.run(["gcloud", "pubsub", "topics", "publish", "jobs", "--attribute=owner=carol@example.com",
                        f"--message={json.dumps({'id': published, 'tpu': 'v5p-8', 'command': 'true'})}"],
                       env=gcloud_env, check=True, capture_output=True, timeout=DEADLINE)
        wait_until(lambda: stored(system_clients, published).get("owner"), timeout=DEADLINE, what="stored")
        assert "owner: carol@example.com" in tpuq(system, "status", published).stdout
        tpuq(system, "cancel", published, "--force")


def test_a_shell_holding_an_earlier_stacks_env_is_told_to_evaluate_it_again(system, tmp_path):
    restarted = tpuq(system, "list", ok=False, **{ENV_STACK_ID: "an-earlier-one"})
    assert restarted.returncode == 1 and 'run `eval "$(tpuq dev env)"` again' in restarted.stderr, restarted.stderr
    moved = tpuq(system, "list", ok=False, FIRESTORE_EMULATOR_HOST="127.0.0.1:9")
    assert moved.returncode == 1 and 'eval "$(tpuq dev env)"' in moved.stderr and "127.0.0.1:9" in moved.stderr
    stopped = tpuq(system, "status", ok=False, TPUQ_DEV_STACK_DIR=str(tmp_path / "gone"))
    assert stopped.returncode == 1 and "was stopped" in stopped.stderr and "tpuq dev up" in stopped.stderr
    assert len(stopped.stderr.strip().splitlines()) == 1, stopped.stderr
