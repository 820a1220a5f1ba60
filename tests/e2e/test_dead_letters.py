"""Finding out what happened, as a user does it: gcloud publishes and uploads, the tpuq CLI answers.

On the e2e session stack: refused gcloud messages found by `tpuq status job-<message id>` and `tpuq dead-letters`;
a reused job id; a whole `jobs:` file as one message; a job file uploaded with `gcloud storage cp` (`bundle: .`,
ids from the job's name, a YAML error with its line and column); billing switched off and on in the fake, with
the blocked reason `tpuq fleet` and `tpuq status` show and its clearing by itself.

Witnesses: what the CLI prints, Firestore (jobs, dead_letters, fleet_status), GCS (result files, bundles)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid

import pytest

from tests.helpers import wait_until
from tpuq.contracts import store
from tpuq.contracts.documents import QR_STATES_RACING, TpuState
from tpuq_dev.faketpu.control import FakeTpuControl

DEADLINE = 120
TZ = "Europe/Paris"  # times read "2026-12-01 15:03:07 CET"
LOCAL_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d CES?T")


@pytest.fixture(scope="module")
def gcloud_env(system, tmp_path_factory):
    """gcloud pointed at the local stack: Pub/Sub's emulator, and fake-gcs-server for `gcloud storage`
    (api_endpoint_overrides/storage: the JSON API's base URL, as docs/DEVELOPING.md says), as environment variables
    (CLOUDSDK_<SECTION>_<PROPERTY>, the same properties `gcloud config set` writes)."""
    return {**os.environ, **system.env, "CLOUDSDK_CONFIG": str(tmp_path_factory.mktemp("gcloud")),
            "CLOUDSDK_CORE_PROJECT": system.project, "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": f"http://{system.env['PUBSUB_EMULATOR_HOST']}/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": f"{system.env['STORAGE_EMULATOR_HOST']}/storage/v1/",
            "TZ": TZ, "COLUMNS": "250"}


def run(env, *args, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=DEADLINE + 60)
    if ok:
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def publish(env, message: dict) -> str:
    """gcloud pubsub topics publish jobs; returns the message id gcloud prints."""
    out = run(env, "gcloud", "pubsub", "topics", "publish", "jobs", "--message", json.dumps(message)).stdout
    return re.search(r"- '(\d+)'", out).group(1)


def doc(clients, collection: str, doc_id: str) -> dict:
    snap = clients.firestore.collection(collection).document(doc_id).get()
    return (snap.to_dict() or {}) if snap.exists else {}


def dead_letter(clients, message_id: str) -> dict:
    return wait_until(lambda: next((d.to_dict() for d in clients.firestore.collection(store.DEAD_LETTERS).stream()
                                    if d.to_dict().get("message_id") == message_id), None),
                      timeout=DEADLINE, what=f"the dead letter of message {message_id}")


def job_in(clients, job_id: str, *states: str) -> dict:
    return wait_until(lambda: (j := doc(clients, store.JOBS, job_id)).get("state") in states and j,
                      timeout=DEADLINE, what=f"job {job_id} in {states}")


def test_refused_gcloud_messages_are_found_by_their_message_id(system_clients, gcloud_env):
    # A message without an id that is refused: gcloud printed its id; `tpuq status job-<id>` finds it.
    mid = publish(gcloud_env, {"tpu": "v9-8", "command": "echo never"})
    assert dead_letter(system_clients, mid)["field"] == "tpu"
    assert doc(system_clients, store.JOBS, f"job-{mid}") == {}  # it never became a job
    shown = run(gcloud_env, "tpuq", "status", f"job-{mid}").stdout
    assert f"job-{mid}: refused, never stored as a job (message {mid} on topic jobs, " in shown
    assert LOCAL_TIME.search(shown)
    assert "  field: tpu" in shown and "unknown TPU type 'v9-8'" in shown
    listed = run(gcloud_env, "tpuq", "dead-letters", "--topic", "jobs").stdout
    # Piped: tab-separated lines, whole reasons (a terminal gets the table).
    cells = next(cells for line in listed.splitlines() if mid in (cells := line.split("\t")))
    assert LOCAL_TIME.search(" ".join(cells)) and "jobs" in cells and f"job-{mid}" in cells and "tpu" in cells, cells
    records = json.loads(run(gcloud_env, "tpuq", "dead-letters", "--json").stdout)
    assert any(r["message_id"] == mid and r["raw_data"] == json.dumps({"tpu": "v9-8", "command": "echo never"})
               for r in records)
    assert run(gcloud_env, "tpuq", "dead-letters", "--topic", "job", ok=False).returncode == 2
    # It is in no job list, but the list says that submissions were refused, and where to read why.
    listed = run(gcloud_env, "tpuq", "list")
    assert f"job-{mid}" not in listed.stdout
    assert re.search(r"note: \d+ submissions? (was|were) refused in the last 24 hours \(`tpuq dead-letters` says why\)",
                     listed.stderr), listed.stderr


def test_a_message_reusing_a_job_id_is_found_both_ways(system_clients, gcloud_env):
    """The stored job is kept; the refusal is found by the message's id and under the stored job."""
    job_id = f"dl-{uuid.uuid4().hex[:8]}"
    first = system_clients.publish("jobs", {"id": job_id, "tpu": "v4-8", "command": "echo first"})
    job_in(system_clients, job_id, "pending", "assigned", "running", "succeeded")
    second = publish(gcloud_env, {"id": job_id, "tpu": "v4-8", "command": "echo second"})
    assert "already used by another submission" in dead_letter(system_clients, second)["reason"]
    assert doc(system_clients, store.JOBS, job_id)["message_id"] == first
    shown = run(gcloud_env, "tpuq", "status", f"job-{second}").stdout
    assert f"it asked for job id {job_id}" in shown and "already used by another submission" in shown
    assert f"refused: message {second} (" in run(gcloud_env, "tpuq", "status", job_id).stdout


def test_a_jobs_file_pasted_as_one_message_submits_every_job(system_clients, gcloud_env):
    """Under ids derived from the message (a redelivery stores nothing new: tests/scheduler/test_job_file_message.py
    delivers it twice)."""
    named = f"dl-{uuid.uuid4().hex[:8]}"
    mid = publish(gcloud_env, {"jobs": [{"tpu": "v4-8", "command": "echo one"},
                                        {"id": named, "tpu": "v4-8", "command": "echo two"}]})
    for stored in (f"job-{mid}-0", named):
        assert job_in(system_clients, stored, "pending", "assigned", "running", "succeeded")["message_id"] == mid
    assert "command: echo one" in run(gcloud_env, "tpuq", "status", f"job-{mid}-0").stdout
    assert (f"job-{mid} is no job: message {mid} submitted {', '.join(sorted([f'job-{mid}-0', named]))}"
            in run(gcloud_env, "tpuq", "status", f"job-{mid}").stdout)


def test_a_job_file_uploaded_with_gcloud_storage_runs_its_folder(system, system_clients, gcloud_env, tmp_path):
    folder = tmp_path / "hello"
    folder.mkdir()
    (folder / "run.sh").write_text('echo "hello from the bucket, worker $TPU_WORKER_ID"\n')
    (folder / "job.yaml").write_text("jobs:\n  - name: Hello Upload\n    tpu: v4-8\n    bundle: .\n"
                                     "    command: sh run.sh\n")
    prefix = f"gs://{system.runner_bucket}/submit/{uuid.uuid4().hex[:8]}"
    # The folder first, the job file last: the folder is packed when the job file's notification arrives.
    run(gcloud_env, "gcloud", "storage", "rsync", str(folder), prefix, "--recursive", "--exclude", r"job\.yaml$")
    run(gcloud_env, "gcloud", "storage", "cp", str(folder / "job.yaml"), f"{prefix}/job.yaml")

    bucket = system_clients.storage.bucket(system.runner_bucket)

    def result(name: str):
        blob = bucket.blob(f"{prefix.split('/', 3)[3]}/{name}.result.json")
        return blob.exists() and json.loads(blob.download_as_bytes())

    [job_id] = wait_until(lambda: result("job.yaml"), timeout=DEADLINE, what="the result beside the job file")["job_ids"]
    assert re.fullmatch(r"hello-upload-[0-9a-f]{8}", job_id)
    job = job_in(system_clients, job_id, "succeeded", "failed")
    assert job["state"] == "succeeded", job.get("reason")
    assert "[w0] hello from the bucket, worker 0" in run(gcloud_env, "tpuq", "logs", job_id).stdout
    bundle = job["spec"]["bundle"]
    assert bundle.startswith(f"gs://{system.runner_bucket}/tpuq/bundles/") and bundle.endswith(".tar.gz")
    assert bucket.blob(bundle.split("/", 3)[3]).exists()

    # A YAML error keeps its line and column, beside the file and in `tpuq dead-letters`.
    (tmp_path / "bad.yaml").write_text("jobs:\n  - tpu: v4-8\n    command: [x\n")
    run(gcloud_env, "gcloud", "storage", "cp", str(tmp_path / "bad.yaml"), f"{prefix}/bad.yaml")
    error = wait_until(lambda: result("bad.yaml"), timeout=DEADLINE, what="the error beside the bad file")["error"]
    assert error.startswith("(job file): not valid YAML at line 4, column 1")
    wait_until(lambda: any(f"{prefix.split('/', 3)[3]}/bad.yaml" in (d.to_dict().get("raw_data") or "")
                           for d in system_clients.firestore.collection(store.DEAD_LETTERS).stream()),
               timeout=DEADLINE, what="the upload's dead letter")
    listed = run(gcloud_env, "tpuq", "dead-letters", "--topic", "gcs-events").stdout
    line = next(line for line in listed.splitlines() if f"{prefix}/bad.yaml" in line)
    assert "(job file)" in line and "not valid YAML at line 4, column 1" in line


def test_billing_off_then_on_shows_a_short_reason_then_clears_by_itself(system, system_clients, gcloud_env):
    control = FakeTpuControl(system.env["TPUQ_TPU_API_ENDPOINT"])
    tpus = system_clients.firestore.collection(store.TPUS)
    racing = system_clients.firestore.collection(store.QUEUED_RESOURCES)
    # No slice to reuse, none on its way: the job must ask for one (earlier tests' idle TPUs go after the demo
    # fleet's 8 s; a racer still being provisioned for an earlier request would take it when it comes up).
    wait_until(lambda: not any(d.to_dict().get("state") in (TpuState.idle, TpuState.busy) and
                               d.to_dict().get("type") == "v4-32" for d in tpus.stream())
               and not any(d.to_dict().get("state") in QR_STATES_RACING and d.to_dict().get("type") == "v4-32"
                           for d in racing.stream()),
               timeout=DEADLINE, what="no v4-32 left from earlier tests, nor on its way")
    control.set_billing(False)
    try:
        job_id = f"bill-{uuid.uuid4().hex[:8]}"
        system_clients.publish("jobs", {"id": job_id, "tpu": "v4-32", "command": "echo billed"})
        status = system_clients.firestore.collection(store.FLEET_STATUS).document("demo")
        try:
            wait_until(lambda: (status.get().to_dict() or {}).get("blocked"), timeout=DEADLINE,
                       what="the billing block")
        except AssertionError:  # say whether it got a slice after all (then nothing was asked for)
            raise AssertionError(f"no billing block; the job: {doc(system_clients, store.JOBS, job_id)}") from None
        short = ("blocked: billing is disabled on project tpuq-local: enable it, then run `tpuq fleet unblock` "
                 "(or wait: tpuq resumes by itself once Cloud Billing reports it enabled)")
        fleet = run(gcloud_env, "tpuq", "fleet").stdout
        assert short in fleet and "the API said" not in fleet and "403" not in fleet
        verbose = run(gcloud_env, "tpuq", "fleet", "--verbose").stdout
        assert re.search(r"the API said: .*(Billing account for project 'tpuq-local' is not found|billingEnabled "
                         "false)", verbose)
        shown = run(gcloud_env, "tpuq", "status", job_id).stdout
        assert "state: pending" in shown and short in shown and "403" not in shown and "http://" not in shown
        as_json = json.loads(run(gcloud_env, "tpuq", "status", job_id, "--json").stdout)
        assert any(re.search("Billing account|billingEnabled false", b["detail"]) for b in as_json["fleet_blocks"])
    finally:
        control.set_billing(True)
    # The cause is gone: the claimer's next billing read clears the block, with nobody running a command.
    assert job_in(system_clients, job_id, "succeeded", "failed")["state"] == "succeeded"
    assert not (status.get().to_dict() or {}).get("blocked")
    assert "blocked:" not in run(gcloud_env, "tpuq", "fleet").stdout
