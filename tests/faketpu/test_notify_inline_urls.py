"""An inline `notify: url:` kept in Secret Manager by `tpuq submit` / `tpuq fleet apply`
(tpuq.operations.notifysecrets), against the fake Secret Manager: one secret per URL, shared with the janitor's
account alone, the destination left naming the secret, and a second submission of the same file adding nothing."""

from __future__ import annotations

import pytest
import requests

from tpuq.contracts.notify import Destination, WebhookFormat
from tpuq.operations.notifysecrets import secret_id_for, sender_member, store_inline_urls
from tpuq.runtime.secretmanager import ACCESSOR_ROLE, SecretManager
from tpuq_dev.faketpu.server import FakeTpuServer

PROJECT = "notify-proj"
SLACK = "https://hooks.slack.com/services/T000/B000/XXXXSECRET"


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    with FakeTpuServer({"zones": {"us-central2-b": {}}}, state_dir=tmp_path_factory.mktemp("faketpu"),
                       worker_hosts=False) as server:
        yield server


def listed(fake) -> dict[str, dict]:
    secrets = requests.get(f"{fake.google_apis_url}/_fake/secrets", timeout=10).json()["secrets"]
    return {s["name"].rsplit("/", 1)[-1]: s for s in secrets}


def test_an_inline_url_becomes_a_secret_only_the_janitor_may_read_once(fake):
    sm = SecretManager(PROJECT, fake.google_apis_url)
    given = [Destination(secret="team-alerts"), Destination(url=SLACK, events=["failed"])]
    stored = store_inline_urls(given, sm, PROJECT)
    secret = secret_id_for(SLACK)
    assert stored[0] == given[0]
    assert stored[1].url is None and stored[1].secret == secret and stored[1].events == ["failed"]
    assert stored[1].format is WebhookFormat.slack  # fixed from the host, which no one will see again
    assert sm.access(secret) == SLACK
    record = listed(fake)[secret]
    assert record["bindings"] == [{"role": ACCESSOR_ROLE, "members": [sender_member(PROJECT)]}]
    assert sender_member(PROJECT) == f"serviceAccount:tpuq-janitor@{PROJECT}.iam.gserviceaccount.com"

    assert store_inline_urls(given, sm, PROJECT) == stored  # the same file again: no new version
    assert listed(fake)[secret]["versions"] == 1
    assert store_inline_urls(None, sm, PROJECT) is None
