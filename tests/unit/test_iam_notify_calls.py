"""The local stack's IAM check on what notification delivery calls: the janitor's read of a webhook secret needs
secretmanager.versions.access on that secret (the fake Secret Manager stands for secretmanager.googleapis.com),
and its POST to the webhook receiver is no Google API at all."""

from __future__ import annotations

from tpuq_dev.iam import calls
from tpuq_dev.iam.model import Project, Resource

JANITOR = "tpuq-janitor@p.iam.gserviceaccount.com"
ENDPOINTS = calls.stack_endpoints({"TPUQ_SECRETMANAGER_API_ENDPOINT": "http://127.0.0.1:5",
                                   "TPUQ_DEV_WEBHOOK_URL": "http://127.0.0.1:6"})
ACCESS = {"account": JANITOR, "kind": "http", "method": "GET",
          "url": "http://127.0.0.1:5/v1/projects/p/secrets/hook/versions/latest:access"}


def test_reading_a_secret_needs_the_accessor_role_on_it():
    project = Project("p")
    (refusal,) = calls.call_refusals(ACCESS, project, ENDPOINTS)
    assert "lacks secretmanager.versions.access on secret hook" in str(refusal)
    project.grant(Resource("secret", "hook"), "roles/secretmanager.secretAccessor", f"serviceAccount:{JANITOR}")
    assert calls.call_refusals(ACCESS, project, ENDPOINTS) == []


def test_a_post_to_the_webhook_receiver_is_no_google_call():
    post = {"account": JANITOR, "kind": "http", "method": "POST", "url": "http://127.0.0.1:6/hook"}
    assert calls.call_refusals(post, Project("p"), ENDPOINTS) == []
