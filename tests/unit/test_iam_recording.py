"""The stack's IAM check (issue 32 §1): the recorder reads each call a service makes, and the check names every one
its account's roles (infra/iam.yaml, as deploy grants them) would not allow: the method, the permission, the account.

Pure, or on a stack object that is never started (its project is deploy's plan, offline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from google.cloud.firestore_v1.types import CommitRequest, Document, Precondition, RunQueryRequest, Write
from google.pubsub_v1.types import PublishRequest, PubsubMessage

from tpuq_dev.devstack.stack import DEMO_DIR, DevStack, StackError
from tpuq_dev.iam import calls, methods
from tpuq_dev.iam.model import Resource
from tpuq_dev.iam.recording import grpc_entry, http_entry, wrap

DB = "projects/tpuq-local/databases/(default)"
STORAGE, TPU, QUOTAS = "http://127.0.0.1:4443", "http://127.0.0.1:5555", "http://127.0.0.1:6666"
ENV = {"STORAGE_EMULATOR_HOST": STORAGE, "TPUQ_TPU_API_ENDPOINT": TPU, "TPUQ_CLOUDQUOTAS_API_ENDPOINT": QUOTAS,
       "TPUQ_CLOUDBILLING_API_ENDPOINT": QUOTAS}
SERVICES = ("scheduler", "claimer", "executor", "janitor")


def account(service: str) -> str:
    return f"tpuq-{service}@tpuq-local.iam.gserviceaccount.com"


# ------------------------------------------------------------ what the recorder reads of a call
def test_a_grpc_commit_is_recorded_with_its_database_and_what_each_write_does():
    request = CommitRequest(database=DB, writes=[
        Write(update=Document(name=f"{DB}/documents/jobs/a"), current_document=Precondition(exists=False)),
        Write(delete=f"{DB}/documents/jobs/b"),
        Write(update=Document(name=f"{DB}/documents/jobs/c"))])
    entry = grpc_entry("/google.firestore.v1.Firestore/Commit", request)
    assert entry == {"kind": "grpc", "method": "/google.firestore.v1.Firestore/Commit", "resource": {"database": DB},
                     "body": {"writes": [{"update": {"name": f"{DB}/documents/jobs/a"},
                                          "currentDocument": {"exists": False}},
                                         {"delete": f"{DB}/documents/jobs/b"},
                                         {"update": {"name": f"{DB}/documents/jobs/c"}}]}}


def test_a_grpc_publish_and_query_are_recorded_with_the_resource_they_name():
    request = PublishRequest(topic="projects/tpuq-local/topics/cancels", messages=[PubsubMessage(data=b"{}")])
    publish = grpc_entry("/google.pubsub.v1.Publisher/Publish", request)
    assert publish["resource"] == {"topic": "projects/tpuq-local/topics/cancels"} and "body" not in publish
    query = grpc_entry("/google.firestore.v1.Firestore/RunQuery", RunQueryRequest(parent=f"{DB}/documents/jobs/j1"))
    assert query["resource"] == {"parent": f"{DB}/documents/jobs/j1"}


def test_an_http_call_is_recorded_with_its_query_and_its_json_body_only():
    create = http_entry("POST", f"{TPU}/v2/projects/p/locations/z/queuedResources?queuedResourceId=q&$alt=json",
                        {"Content-Type": "application/json"}, b'{"tpu": {"nodeSpec": [{"nodeId": "n"}]}}')
    assert create == {"kind": "http", "method": "POST", "url": f"{TPU}/v2/projects/p/locations/z/queuedResources",
                      "query": {"queuedResourceId": "q", "$alt": "json"},
                      "body": {"tpu": {"nodeSpec": [{"nodeId": "n"}]}}}
    upload = http_entry("POST", f"{STORAGE}/upload/storage/v1/b/r/o?uploadType=multipart&ifGenerationMatch=0",
                        {"Content-Type": "multipart/related; boundary=x"}, b"--x\r\n...")
    assert "body" not in upload and upload["query"] == {"uploadType": "multipart", "ifGenerationMatch": "0"}


def test_a_service_runs_under_the_recorder_unchanged_and_each_call_names_its_account(tmp_path):
    """The wrapper the stack starts services with: hooks installed, then the module run as `python -m` would."""
    (tmp_path / "calls_google.py").write_text(textwrap.dedent(f"""
        import sys, grpc, requests
        from google.pubsub_v1.types import PublishRequest
        assert sys.argv[1:] == ["--port", "1"], sys.argv
        channel = grpc.insecure_channel("127.0.0.1:1")
        publish = channel.unary_unary("/google.pubsub.v1.Publisher/Publish",
                                      request_serializer=PublishRequest.serialize)
        try:
            publish(PublishRequest(topic="projects/p/topics/t"), timeout=0.2)
        except grpc.RpcError:
            pass
        try:
            requests.get("{STORAGE}/storage/v1/b/r/o?prefix=x", timeout=0.5)
        except requests.ConnectionError:
            pass
        """))
    record = tmp_path / "calls.jsonl"
    argv = wrap([sys.executable, "-m", "calls_google", "--port", "1"], str(record), account("executor"))
    path = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    r = subprocess.run(argv, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    grpc_call, http_call = calls.read(record)
    assert grpc_call["account"] == http_call["account"] == account("executor")
    assert (grpc_call["method"], grpc_call["resource"]) == ("/google.pubsub.v1.Publisher/Publish",
                                                            {"topic": "projects/p/topics/t"})
    assert (http_call["method"], http_call["url"], http_call["query"]) == ("GET", f"{STORAGE}/storage/v1/b/r/o",
                                                                           {"prefix": "x"})


# ------------------------------------------------------------ from a call to the method table
def test_a_grpc_call_finds_the_row_of_the_same_method_with_its_resource():
    publish = methods.find_grpc("/google.pubsub.v1.Publisher/Publish", "projects/p/topics/cancels")
    assert publish.method.id == "pubsub.projects.topics.publish" and publish.variables["topic"] == "cancels"
    query = methods.find_grpc("/google.firestore.v1.Firestore/RunQuery", f"{DB}/documents/jobs/j1")
    assert query.method.id == "firestore.projects.databases.documents.runQuery"
    assert query.variables.items() >= {"project": "tpuq-local", "database": "(default)"}.items()


def test_a_stand_ins_url_is_the_google_url_it_stands_for():
    endpoints = calls.stack_endpoints(ENV)
    assert calls.google_url("GET", f"{STORAGE}/download/storage/v1/b/r/o/a%2Fb", endpoints) == \
        "https://storage.googleapis.com/download/storage/v1/b/r/o/a%2Fb"
    # Cloud Quotas and Cloud Billing share one stand-in: each URL goes where a row knows it.
    assert calls.google_url("GET", f"{QUOTAS}/v1/projects/p/billingInfo", endpoints) == \
        "https://cloudbilling.googleapis.com/v1/projects/p/billingInfo"
    assert calls.google_url("GET", f"{QUOTAS}/v1/projects/p/locations/global/services/tpu.googleapis.com/quotaInfos/Q",
                            endpoints).startswith("https://cloudquotas.googleapis.com/v1/projects/p/")


@pytest.mark.parametrize("writes, needed", [
    ([{"update": {"name": "d"}}], {"datastore.entities.create", "datastore.entities.update"}),
    ([{"update": {"name": "d"}, "currentDocument": {"exists": False}}], {"datastore.entities.create"}),
    ([{"update": {"name": "d"}, "currentDocument": {"exists": True}}], {"datastore.entities.update"}),
    ([{"delete": "d"}], {"datastore.entities.delete"}),
    ([], {"datastore.databases.get"}),
])
def test_a_commit_needs_what_its_writes_do(writes, needed):
    """https://cloud.google.com/firestore/docs/security/iam: create, update or both by precondition; delete."""
    row = methods.find_grpc("/google.firestore.v1.Firestore/Commit", DB).method
    assert {n.permission for n in row.needs if methods.applies(n, {}, {"writes": writes})} == needed


# ------------------------------------------------------------ the check, on the project deploy's grants make
@pytest.fixture
def stack(tmp_path):
    """A stack object as the demo's stack is configured (never started): its project is deploy's, offline."""
    s = DevStack(state_dir=tmp_path, services=SERVICES, fleet_file=DEMO_DIR / "fleet.yaml",
                 extra_buckets=("tpuq-demo-us-central2",))
    s.env.update({**ENV, **{f"TPUQ_{n.upper()}_URL": f"http://127.0.0.1:{9000 + i}" for i, n in enumerate(SERVICES)}})
    return s


def guest_attributes(service: str) -> dict:
    return {"account": account(service), "kind": "http", "method": "POST", "query": {"$alt": "json"}, "body": {},
            "url": f"{TPU}/v2/projects/tpuq-local/locations/us-central2-b/nodes/n1:getGuestAttributes"}


def status_read(service: str, bucket: str = "tpuq-runner") -> dict:
    return {"account": account(service), "kind": "http", "method": "GET", "query": {"alt": "media"},
            "url": f"{STORAGE}/download/storage/v1/b/{bucket}/o/tpuq%2Fstatus%2Fj%2F1%2Fworker-0.json"}


def test_what_each_service_calls_is_allowed_by_the_roles_deploy_grants_it(stack):
    recorded = [guest_attributes("executor"), status_read("executor"), status_read("scheduler"),
                {"account": account("claimer"), "kind": "http", "method": "GET", "query": {},
                 "url": f"{QUOTAS}/v1/projects/tpuq-local/locations/global/services/tpu.googleapis.com/quotaInfos/Q"},
                {"account": account("janitor"), "kind": "grpc", "method": "/google.firestore.v1.Firestore/Commit",
                 "resource": {"database": DB}, "body": {"writes": [{"delete": f"{DB}/documents/tpus/t"}]}}]
    assert calls.refusals(recorded, calls.stack_project(stack), calls.stack_endpoints(stack.env)) == []


def test_a_call_the_accounts_roles_do_not_allow_is_refused_naming_method_permission_and_account(stack):
    project = calls.stack_project(stack)
    project.bindings = {b for b in project.bindings
                        if not (b[1] == "roles/tpu.viewer" and b[2] == f"serviceAccount:{account('executor')}")}
    (refusal,) = calls.refusals([guest_attributes("executor")] * 3, project, calls.stack_endpoints(stack.env))
    assert str(refusal) == (
        "tpu.projects.locations.nodes.getGuestAttributes (POST https://tpu.googleapis.com/v2/projects/tpuq-local/"
        f"locations/us-central2-b/nodes/n1:getGuestAttributes): {account('executor')} lacks tpu.nodes.get on project "
        "tpuq-local")
    # The janitor holds no role on any bucket: reading a status object is refused, on that bucket.
    (refusal,) = calls.refusals([status_read("janitor")], project, calls.stack_endpoints(stack.env))
    assert (refusal.method, refusal.permission, refusal.resource, refusal.principal) == (
        "storage.objects.get", "storage.objects.get", Resource("bucket", "tpuq-runner"),
        f"serviceAccount:{account('janitor')}")


def test_a_call_no_row_describes_is_refused_and_the_librarys_own_background_read_is_only_advisory(stack):
    project, endpoints = calls.stack_project(stack), calls.stack_endpoints(stack.env)
    unknown = {"account": account("claimer"), "kind": "grpc", "method": "/google.firestore.v1.Firestore/Listen",
               "resource": {"database": DB}}
    (refusal,) = calls.refusals([unknown], project, endpoints)
    assert "gRPC /google.firestore.v1.Firestore/Listen" in str(refusal) and "no row" in str(refusal)
    bucket_read = {"account": account("executor"), "kind": "http", "method": "GET", "query": {},
                   "url": f"{STORAGE}/storage/v1/b/tpuq-runner", "thread": "Thread-7 (_fetch_background)"}
    (refusal,) = calls.refusals([bucket_read], project, endpoints)
    assert refusal.permission == "storage.buckets.get" and refusal.advisory and calls.blocking([refusal]) == []
    (refusal,) = calls.refusals([{**bucket_read, "thread": "ThreadPoolExecutor-0_1"}], project, endpoints)
    assert calls.blocking([refusal]) == [refusal]  # tpuq's own code reading the bucket would need the grant
    # google.auth asking the instance's metadata server for a token or the project is no API call: no IAM.
    metadata = [{"account": account("claimer"), "kind": "http", "method": "GET", "query": {},
                 "url": f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token"}
                for host in ("169.254.169.254", "metadata.google.internal")]
    assert calls.refusals(metadata, project, endpoints) == []


def test_a_stack_whose_services_made_a_refused_call_fails_when_it_stops(stack, monkeypatch):
    """What every stack fixture gets from DevStack.running(): the check at teardown, naming each refusal."""
    monkeypatch.setattr(DevStack, "up", lambda self: dict(self.env))
    monkeypatch.setattr(DevStack, "down", lambda self: [])
    stack.iam_calls_file.write_text(json.dumps(status_read("janitor")) + "\n")
    with pytest.raises(StackError) as refused:
        with stack.running():
            pass
    assert f"{account('janitor')} lacks storage.objects.get on bucket tpuq-runner" in str(refused.value)
    stack.iam_calls_file.write_text(json.dumps(status_read("executor")) + "\n")
    with stack.running():
        pass


def test_the_stack_starts_each_service_under_the_recorder_as_its_own_account(stack):
    assert stack.service_account("claimer") == account("claimer")
    argv = wrap(["python", "-m", "tpuq.runtime.entrypoints", "claimer", "--port", "1"], str(stack.iam_calls_file),
                stack.service_account("claimer"))
    assert argv == ["python", "-m", "tpuq_dev.iam.recording", "--to", str(stack.iam_calls_file), "--account",
                    account("claimer"), "--", "tpuq.runtime.entrypoints", "claimer", "--port", "1"]
    assert Path(stack.iam_calls_file).parent == stack.state_dir
