"""One session key for every dashboard process (issue 32 §7b): a form one instance rendered is accepted by another,
and by the same service after a cold start. Before, each process signed sessions with a key of its own, so Cloud
Run's scale to zero voided every open form, and the service was held to one instance.

Deployed, the key is the secret `tpuq-ui-session-key`, which deploy makes (random bytes made when applied, never in
a plan or a line printed), grants the dashboard's account and mounts as the file `TPUQ_UI_SESSION_KEY_FILE` names;
`tpuq ui` keeps one in its state directory."""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import threading

import pytest
import yaml

from tests.deploy.fakes import RecordingApi, state_after
from tests.ui.test_ui_identity import token
from tests.ui.test_ui_routes import NOW, FakeClients, job_doc
from tpuq.contracts import store
from tpuq.runtime.auth import strip_signature
from tpuq.deploy import gcp, generated_secrets
from tpuq.deploy.infra import load_infra
from tpuq.deploy.plan import ProjectState, Target, desired_run_service, plan
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile
from tpuq.ui import sessionkey
from tpuq.ui.serve import deployed_app

ALICE = "alice@example.com"
AS_ALICE = {"Authorization": f"Bearer {strip_signature(token(email=ALICE))}"}  # through Cloud Run's invoker check
SECRET = "tpuq-ui-session-key"
TARGET = Target(fleet=FleetFile.model_validate(yaml.safe_load(EXAMPLE_FLEET)), project_number="42")
INFRA = load_infra(TARGET.variables())


@pytest.fixture
def clients(monkeypatch):
    world = FakeClients()
    world.firestore.collection(store.JOBS).document("j-1").set(job_doc("j-1", "pending", "normal", owner=ALICE))
    monkeypatch.setattr("tpuq.runtime.clients.Clients", lambda settings: world)  # what deployed_app makes its clients with
    return world


def instance(key_file):
    """One tpuq-ui process as Cloud Run starts it: its environment as deploy sets it, the secret mounted as a file."""
    app = deployed_app({"GOOGLE_CLOUD_PROJECT": "my-trc-project", "TPUQ_UI_AUTH": "cloudrun",
                        sessionkey.ENV_SESSION_KEY_FILE: str(key_file)}, now=lambda: NOW)
    app.testing = True
    return app.test_client()


def test_a_form_one_instance_rendered_is_accepted_by_another(tmp_path, clients):
    key_file = tmp_path / "key"
    key_file.write_bytes(os.urandom(32))  # the secret's version, as Cloud Run mounts it
    first, second = instance(key_file), instance(key_file)  # two instances, or one before and after a cold start
    confirm = first.get("/jobs/j-1/priority?priority=low", headers=AS_ALICE).get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', confirm).group(1)
    second.set_cookie("session", first.get_cookie("session").value)  # the browser sends its cookie to whichever
    done = second.post("/jobs/j-1/priority", data={"csrf_token": csrf, "priority": "low"}, headers=AS_ALICE)
    assert done.status_code == 200, done.get_data(as_text=True)
    assert clients.firestore.collection(store.JOBS).document("j-1").get().to_dict()["priority"] == "low"


def test_another_key_still_refuses_the_form(tmp_path, clients):
    (tmp_path / "a").write_bytes(os.urandom(32))
    (tmp_path / "b").write_bytes(os.urandom(32))
    first, other = instance(tmp_path / "a"), instance(tmp_path / "b")
    confirm = first.get("/jobs/j-1/priority?priority=low", headers=AS_ALICE).get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', confirm).group(1)
    other.set_cookie("session", first.get_cookie("session").value)
    refused = other.post("/jobs/j-1/priority", data={"csrf_token": csrf, "priority": "low"}, headers=AS_ALICE)
    assert refused.status_code == 403
    assert clients.firestore.collection(store.JOBS).document("j-1").get().to_dict()["priority"] == "normal"


@pytest.mark.parametrize("content", [None, b"short"])
def test_a_key_file_that_is_named_but_missing_or_short_stops_the_start(tmp_path, content):
    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_bytes(content)
    with pytest.raises(sessionkey.SessionKeyError, match=str(key_file)) as e:
        instance(key_file)
    assert "short" not in str(e.value)  # the message names the file, never what it holds


def test_tpuq_ui_makes_its_key_once_owner_only_and_keeps_it(tmp_path):
    path = sessionkey.local_key_path(tmp_path / "state")
    assert path == tmp_path / "state" / sessionkey.KEY_FILE_NAME
    key = sessionkey.ensure_key_file(path)
    assert len(key) == sessionkey.KEY_BYTES and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sessionkey.ensure_key_file(path, random_bytes=lambda n: b"\x01" * n) == key  # a restart reads the same
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # nothing left aside


def test_processes_starting_at_once_agree_on_one_key(tmp_path):
    path, keys, start = tmp_path / sessionkey.KEY_FILE_NAME, [], threading.Barrier(8)

    def process():
        start.wait()
        keys.append(sessionkey.ensure_key_file(path))

    threads = [threading.Thread(target=process) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1


# ------------------------------------------------------------ what deploy does for it
def test_deploy_makes_the_secret_grants_it_and_mounts_it_where_the_dashboard_reads():
    actions = plan(TARGET, INFRA, ProjectState(known=True, project_number="42", secrets=set()))
    whats = [a.what for a in actions]
    create, version = (next(a for a in actions if a.what == w) for w in (f"secret {SECRET}", f"secret {SECRET} version"))
    assert create.request.params == {"secretId": SECRET} and create.request.body["labels"] == TARGET.labels
    (grant,) = [a for a in actions if a.iam is not None and a.iam.key == f"secret:{SECRET}"]
    assert (grant.role, grant.member) == ("roles/secretmanager.secretAccessor",
                                          "serviceAccount:tpuq-ui@my-trc-project.iam.gserviceaccount.com")
    service = whats.index("Cloud Run service tpuq-ui")
    assert whats.index(create.what) < whats.index(version.what) < actions.index(grant) < service
    body = desired_run_service(TARGET, INFRA, "ui", {SECRET})
    (volume,) = body["template"]["volumes"]
    (mount,) = body["template"]["containers"][0]["volumeMounts"]
    env = {e["name"]: e["value"] for e in body["template"]["containers"][0]["env"]}
    assert volume["secret"] == {"secret": SECRET, "items": [{"path": "key", "version": "latest"}]}
    assert env[sessionkey.ENV_SESSION_KEY_FILE] == f"{mount['mountPath']}/key"
    assert generated_secrets.declared(INFRA)[SECRET] >= sessionkey.MIN_KEY_BYTES  # what the dashboard accepts


def test_its_value_is_made_when_applied_and_never_shown():
    actions = plan(TARGET, INFRA, ProjectState(known=True, project_number="42", secrets=set()))
    secretmanager = RecordingApi("secretmanager")
    adapters = {name: RecordingApi(name) for name in [*gcp.BASE_URLS, "fleetstore"]}
    adapters["secretmanager"] = secretmanager
    echoed, made = [], []

    def random_bytes(n: int) -> bytes:
        made.append(os.urandom(n))
        return made[-1]

    gcp.apply(actions, adapters, echo=echoed.append, sleep=lambda s: None, random_bytes=random_bytes)
    (sent,) = [r for r in secretmanager.sent if r.path.endswith(":addVersion")]
    value = base64.b64encode(made[0]).decode()
    assert len(made) == 1 and len(made[0]) == 32 and sent.body == {"payload": {"data": value}}
    shown = json.dumps([gcp.wire_requests(a) for a in actions]) + " ".join(map(str, actions)) + " ".join(echoed)
    assert value not in shown and repr(made[0]) not in shown
    (dry,) = [line for a in actions for line in gcp.wire_requests(a) if line["url"].endswith(":addVersion")]
    assert dry["body"]["payload"]["data"] == base64.b64encode(bytes(32)).decode()  # zeros stand in for it


def test_a_secret_left_without_a_version_gets_one_and_a_complete_one_nothing():
    made = state_after(plan(TARGET, INFRA, ProjectState(known=True, project_number="42", secrets=set())), secrets=())
    assert SECRET in made.secrets and not [a for a in plan(TARGET, INFRA, made) if SECRET in a.what]
    made.versionless_secrets = {SECRET}  # a deploy stopped between the create and the version
    assert [(a.verb, a.what) for a in plan(TARGET, INFRA, made) if SECRET in a.what] == [
        ("create", f"secret {SECRET} version")]


def test_reading_the_project_finds_a_secret_without_an_enabled_version():
    class Versions(RecordingApi):
        def list_all(self, path, key, params=None):
            return [{"name": f"{path}/{SECRET}"}]

        def call(self, method, path, params=None, body=None):
            assert (method, path, params) == ("GET", f"projects/my-trc-project/secrets/{SECRET}/versions",
                                              {"filter": "state:ENABLED", "pageSize": 1})
            return {}  # no enabled version: Secret Manager leaves `versions` out of an empty list

    adapters = {name: RecordingApi(name) for name in [*gcp.BASE_URLS, "fleetstore"]}
    adapters["secretmanager"] = Versions("secretmanager")
    state, _ = gcp.read_state(adapters, TARGET, INFRA)
    assert state.secrets == {SECRET} and state.versionless_secrets == {SECRET}


def test_tpuq_ui_signs_with_the_key_in_the_stacks_state_dir_across_restarts(tmp_path, monkeypatch):
    from tpuq.cli import connecting
    from tpuq.cli.ui import ui

    backend = connecting.Backend(connecting.LOCAL_STACK, {}, "tpuq-local", "test", state_dir=str(tmp_path))

    def cli_clients():
        connecting.CURRENT = backend
        return FakeClients()

    served = []
    monkeypatch.setattr(connecting, "CURRENT", None)  # restored after: cli_clients sets it
    monkeypatch.setattr(connecting, "cli_clients", cli_clients)
    monkeypatch.setattr("tpuq.ui.serve.serve", lambda app, host, port, ready: served.append(app))
    ui(port=0, host="127.0.0.1")
    ui(port=0, host="127.0.0.1")  # started again
    key = (tmp_path / sessionkey.KEY_FILE_NAME).read_bytes()
    assert [app.secret_key for app in served] == [key, key]
