"""The fake's Secret Manager: tpuq's adapter (tpuq.runtime.secretmanager), gcloud's own commands, and Google's
refusals (tpuq_dev.faketpu.secretmanager cites the page for each)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import threading

import pytest
import requests

from tpuq.runtime.secretmanager import ACCESSOR_ROLE, SecretError, SecretManager, SecretNotFound
from tpuq_dev.faketpu.server import FakeTpuServer

PROJECT = "secret-proj"
GCLOUD = shutil.which("gcloud")


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    with FakeTpuServer({"zones": {"us-central2-b": {}}}, state_dir=tmp_path_factory.mktemp("faketpu"),
                       worker_hosts=False) as server:
        yield server


@pytest.fixture
def sm(fake) -> SecretManager:
    return SecretManager(PROJECT, fake.google_apis_url)


def api(fake, method: str, path: str, **kw) -> requests.Response:
    return requests.request(method, f"{fake.google_apis_url}/v1/projects/{PROJECT}/{path}", timeout=10, **kw)


def error_of(response: requests.Response) -> tuple[int, str]:
    err = response.json()["error"]
    assert set(err) >= {"code", "message", "status"}
    return response.status_code, err["status"]


def test_put_then_access_latest_and_numbered(sm, fake):
    first = sm.put("hook-a", "https://hooks.slack.com/services/T/B/one", labels={"tpuq": "notify"})
    second = sm.put("hook-a", "https://hooks.slack.com/services/T/B/two")
    assert (first, second) == (f"projects/{PROJECT}/secrets/hook-a/versions/1",
                                f"projects/{PROJECT}/secrets/hook-a/versions/2")
    assert sm.access("hook-a") == "https://hooks.slack.com/services/T/B/two"
    assert sm.access(f"projects/{PROJECT}/secrets/hook-a") == "https://hooks.slack.com/services/T/B/two"
    one = api(fake, "GET", "secrets/hook-a/versions/1:access").json()
    assert base64.b64decode(one["payload"]["data"]) == b"https://hooks.slack.com/services/T/B/one"
    assert int(one["payload"]["dataCrc32c"]) > 0
    assert api(fake, "GET", "secrets/hook-a").json()["labels"] == {"tpuq": "notify"}


def test_google_refusals(sm, fake):
    sm.put("hook-b", "x")
    assert error_of(api(fake, "POST", "secrets", params={"secretId": "bad.id"},
                        json={"replication": {"automatic": {}}})) == (400, "INVALID_ARGUMENT")
    assert error_of(api(fake, "POST", "secrets", params={"secretId": "a" * 256},
                        json={"replication": {"automatic": {}}})) == (400, "INVALID_ARGUMENT")
    assert error_of(api(fake, "POST", "secrets", params={"secretId": "hook-b"},
                        json={"replication": {"automatic": {}}})) == (409, "ALREADY_EXISTS")
    big = base64.b64encode(b"x" * (64 * 1024 + 1)).decode()
    assert error_of(api(fake, "POST", "secrets/hook-b:addVersion",
                        json={"payload": {"data": big}})) == (400, "INVALID_ARGUMENT")
    exact = base64.b64encode(b"x" * (64 * 1024)).decode()
    assert api(fake, "POST", "secrets/hook-b:addVersion", json={"payload": {"data": exact}}).status_code == 200
    assert error_of(api(fake, "POST", "secrets/hook-b:addVersion",
                        json={"payload": {"data": "eA==", "dataCrc32c": "1"}})) == (400, "INVALID_ARGUMENT")
    assert error_of(api(fake, "GET", "secrets/nope/versions/latest:access")) == (404, "NOT_FOUND")
    assert error_of(api(fake, "GET", "secrets/hook-b/versions/9:access")) == (404, "NOT_FOUND")
    api(fake, "POST", "secrets", params={"secretId": "empty"}, json={"replication": {"automatic": {}}})
    assert error_of(api(fake, "GET", "secrets/empty/versions/latest:access")) == (404, "NOT_FOUND")
    with pytest.raises(SecretNotFound) as caught:
        sm.access("nope")
    assert "nope" in str(caught.value)


def test_stale_etag_is_aborted_and_grant_accessor_reads_again(sm, fake):
    sm.put("hook-c", "x")
    stale = api(fake, "GET", "secrets/hook-c:getIamPolicy").json()
    sm.grant_accessor("hook-c", "serviceAccount:a@p.iam.gserviceaccount.com")
    refused = api(fake, "POST", "secrets/hook-c:setIamPolicy",
                  json={"policy": {**stale, "bindings": [{"role": ACCESSOR_ROLE, "members": ["user:x@y"]}]}})
    assert error_of(refused) == (409, "ABORTED")
    threads = [threading.Thread(target=sm.grant_accessor, args=("hook-c", f"serviceAccount:s{i}@p.iam"))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sm.grant_accessor("hook-c", "serviceAccount:a@p.iam.gserviceaccount.com")  # already there: no change
    policy = api(fake, "GET", "secrets/hook-c:getIamPolicy").json()
    assert policy["bindings"] == [{"role": ACCESSOR_ROLE, "members": sorted(
        ["serviceAccount:a@p.iam.gserviceaccount.com", *(f"serviceAccount:s{i}@p.iam" for i in range(4))])}]


def test_errors_never_hold_the_payload(fake):
    sm = SecretManager(PROJECT, "http://127.0.0.1:9")  # nothing listens
    with pytest.raises(SecretError) as caught:
        sm.access("hook-a")
    assert "hooks.slack.com" not in str(caught.value)


def test_gcloud_secrets_create_and_access(fake, tmp_path):
    if GCLOUD is None:
        pytest.skip("gcloud is not installed")
    env = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
           "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": fake.google_apis_url + "/",
           "CLOUDSDK_CORE_PROJECT": PROJECT}

    def gcloud(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([GCLOUD, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    gcloud("config", "set", "auth/disable_credentials", "true")
    gcloud("secrets", "create", "gcloud-hook", "--data-file=-", stdin="https://example.com/hook/abc")
    done = gcloud("secrets", "versions", "access", "latest", "--secret", "gcloud-hook")
    assert done.stdout == "https://example.com/hook/abc"
    assert SecretManager(PROJECT, fake.google_apis_url).access("gcloud-hook") == "https://example.com/hook/abc"


def test_production_goes_to_google_with_default_credentials_made_on_first_use():
    """No endpoint: secretmanager.googleapis.com through an AuthorizedSession made at the first call, not before."""
    from tpuq.runtime.secretmanager import LazyAuthorizedSession

    sent, made = [], []

    class Session:
        def request(self, method, url, **kw):
            sent.append((method, url))
            return type("R", (), {"status_code": 200, "content": b"{}", "json": lambda self: {
                "payload": {"data": base64.b64encode(b"https://x/hook").decode()}}})()

    sm = SecretManager("p", session=LazyAuthorizedSession(lambda: made.append(1) or Session()))
    assert made == []
    assert sm.access("s") == "https://x/hook"
    assert sent == [("GET", "https://secretmanager.googleapis.com/v1/projects/p/secrets/s/versions/latest:access")]
    assert SecretManager("p").base == "https://secretmanager.googleapis.com/v1/"
