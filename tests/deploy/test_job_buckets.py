"""The fleet's job_buckets: deploy lets the workers' account write them, never touching any other binding."""

from __future__ import annotations

import copy

import pytest
import yaml
from pydantic import ValidationError

from tpuq.deploy import gcp, job_buckets
from tpuq.deploy.infra import load_infra
from tpuq.deploy.plan import ProjectState, Target, plan
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile

from .fakes import RecordingApi

BASE = {**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh"}
WORKER = "serviceAccount:tpuq-worker@my-trc-project.iam.gserviceaccount.com"


def target(**fleet) -> Target:
    return Target(fleet=FleetFile.model_validate({**BASE, **fleet}), project_number="42")


def grants_on(actions, bucket: str, member: str | None = None):
    """The grants on one bucket (to one member: the dashboard's account reads them too)."""
    return [a for a in actions if a.verb == "grant" and a.iam.label == f"bucket gs://{bucket}"
            and (member is None or a.member == member)]


def test_each_job_bucket_gets_object_admin_for_the_workers_account():
    t = target(job_buckets=["gs://data-eu", "data-us"])
    actions = plan(t, load_infra(t.variables()), ProjectState())
    for bucket in ("data-eu", "data-us"):
        (grant,) = grants_on(actions, bucket, WORKER)
        assert (grant.role, grant.member) == ("roles/storage.objectAdmin", WORKER)
        assert (grant.iam.get.method, grant.iam.get.path) == ("GET", f"b/{bucket}/iam")
        assert (grant.iam.set_method, grant.iam.set_path, grant.iam.wrap_policy) == ("PUT", f"b/{bucket}/iam", False)
    assert not [a for a in actions if a.verb == "create" and "data-eu" in a.what]  # never created by tpuq


def test_a_missing_job_bucket_is_a_todo_and_is_not_granted():
    t = target(job_buckets=["gs://data-eu", "gs://gone"])
    actions = plan(t, load_infra(t.variables()), ProjectState(known=True, project_number="42", missing_buckets={"gone"}))
    assert not grants_on(actions, "gone") and grants_on(actions, "data-eu")
    (todo,) = [a for a in actions if a.what == "bucket gs://gone"]
    assert todo.verb == "todo" and "does not exist" in todo.detail
    assert todo.commands[0].startswith("gcloud storage buckets create gs://gone ")


class BucketIam:
    """Cloud Storage's bucket IAM: GET b/X/iam returns the policy itself; PUT replaces it (no {"policy": ...})."""

    def __init__(self, policy: dict):
        self.policy, self.puts = policy, []

    def send(self, request):
        if request.method == "GET":
            return copy.deepcopy(self.policy)
        self.puts.append(request)
        self.policy = request.body
        return self.policy


def test_the_grant_is_a_read_modify_write_that_keeps_every_other_binding():
    t = target(job_buckets=["gs://data-eu"])
    (grant,) = grants_on(plan(t, load_infra(t.variables()), ProjectState()), "data-eu", WORKER)
    others = [{"role": "roles/storage.objectViewer", "members": ["allUsers"]},
              {"role": "roles/storage.objectAdmin", "members": ["user:me@example.com"],
               "condition": {"title": "tmp", "expression": "true"}}]
    api = BucketIam({"etag": "CAE=", "bindings": copy.deepcopy(others)})
    gcp.apply([grant], {"storage": api}, echo=lambda line: None)
    (put,) = api.puts
    assert put.path == "b/data-eu/iam" and put.body["etag"] == "CAE="
    assert put.body["bindings"] == [*others, {"role": "roles/storage.objectAdmin", "members": [WORKER]}]


class Buckets:
    def __init__(self, present: set[str], forbidden: set[str] = frozenset()):
        self.present, self.forbidden = present, forbidden

    def get_or_none(self, path, params=None):
        name = path.split("/")[1]
        if name in self.forbidden:
            raise gcp.ApiError("storage", "GET", path, 403, "forbidden")
        return {"name": name} if name in self.present else None


def test_reading_finds_the_missing_buckets_and_a_403_is_a_note():
    t = target(job_buckets=["gs://here", "gs://gone", "gs://elsewhere"])
    notes: list[str] = []
    missing = job_buckets.read_missing(Buckets({"here"}, forbidden={"elsewhere"}), t,
                                       lambda read, what: gcp._tolerant(read, None, notes, what))
    assert missing == {"gone"}
    assert notes == ["job bucket gs://elsewhere: read as empty (HTTP 403)"]


@pytest.mark.parametrize("bad, reason", [(["gs://bkt/some/path"], "must be a bucket URI"),
                                         (["gs://bkt", "bkt"], "listed twice"), (["gs://UPPER"], "valid bucket")])
def test_job_buckets_must_be_bucket_uris(bad, reason):
    with pytest.raises(ValidationError, match=reason):
        FleetFile.model_validate({**BASE, "job_buckets": bad})


class ForeignBucketStorage(RecordingApi):
    """Cloud Storage in a project whose deployer may not touch one job bucket at all (another project's): its metadata
    and its IAM policy answer 403; every other job bucket exists, with an empty policy."""

    def __init__(self, job_buckets: list[str], foreign: str):
        super().__init__("storage")
        self.job_buckets, self.foreign = job_buckets, foreign

    def _refuse(self, method, path):
        if path.startswith(f"b/{self.foreign}/") or path == f"b/{self.foreign}":
            raise gcp.ApiError("storage", method, path, 403, f"tpuq-deploy@p.iam.gserviceaccount.com does not have "
                               "storage.buckets.getIamPolicy access to the Google Cloud Storage bucket.")

    def get_or_none(self, path, params=None):
        self._refuse("GET", path)
        return {"name": path.split("/")[1]} if path.split("/")[1] in self.job_buckets else None

    def send(self, request):
        self._refuse(request.method, request.path)
        return super().send(request)


def test_a_job_bucket_whose_policy_deploy_may_not_read_is_a_todo_for_its_owner_and_the_deploy_goes_on():
    """Read as an empty policy, it was granted on: the grant's own read failed and the deploy stopped halfway."""
    t = target(job_buckets=["gs://data-eu", "gs://their-data"])
    storage = ForeignBucketStorage(["data-eu"], foreign="their-data")
    adapters = {name: RecordingApi(name) for name in [*gcp.BASE_URLS, "fleetstore"]}
    adapters["storage"] = storage
    infra = load_infra(t.variables())
    state, notes = gcp.read_state(adapters, t, infra)
    assert state.unreadable_job_buckets == {"their-data"} and state.missing_buckets == set()
    actions = plan(t, infra, state)
    assert grants_on(actions, "data-eu", WORKER) and not grants_on(actions, "their-data")
    (todo,) = [a for a in actions if a.what == "bucket gs://their-data"]
    assert todo.verb == "todo" and "may not read its IAM policy" in todo.detail and "BUCKET'S OWNER" in todo.detail
    ui = "serviceAccount:tpuq-ui@my-trc-project.iam.gserviceaccount.com"
    assert set(todo.commands) == {
        f"gcloud storage buckets add-iam-policy-binding gs://their-data --member={WORKER} --role=roles/storage.objectAdmin",
        f"gcloud storage buckets add-iam-policy-binding gs://their-data --member={ui} --role=roles/storage.objectViewer"}
    sent = gcp.apply(actions, adapters, echo=lambda line: None, sleep=lambda s: None)  # to the end: nothing raises
    assert sent == sum(a.sends for a in actions)
    policies_set = {r.path for r in storage.sent if r.path.endswith("/iam")}
    assert "b/data-eu/iam" in policies_set and "b/their-data/iam" not in policies_set


def test_a_job_bucket_policy_refused_only_while_the_storage_api_is_being_enabled_is_granted():
    t = target(job_buckets=["gs://data-eu"])
    state = ProjectState(known=True)
    disabled = gcp.ApiError("storage", "GET", "b/data-eu/iam", 403, "Access Not Configured.",
                            frozenset({("usageLimits", "accessNotConfigured")}))
    gcp._unreadable_job_bucket(state, "job_bucket:data-eu")(disabled)
    gcp._unreadable_job_bucket(state, "bucket:runner")(gcp.ApiError("storage", "GET", "b/r/iam", 403, "forbidden"))
    assert state.unreadable_job_buckets == set()
    assert grants_on(plan(t, load_infra(t.variables()), state), "data-eu", WORKER)
