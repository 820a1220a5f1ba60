"""`notify:` as users write it: what is accepted, what is refused (naming the field), where a webhook URL may
appear (in a file the CLI reads) and where it may not (anything a service stores), and who is told of what."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import yaml
from pydantic import ValidationError

from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.jobspec import JobFile, PublishedJob
from tpuq.contracts.notify import (DEFAULT_EVENTS, SENDER_ACCOUNT_ID, Destination, Notification, NotifyEvent,
                                   WebhookFormat, destinations_for, format_for_url, masked_url)
from tpuq.runtime.fleetstore import save_fleet
from tpuq_dev.inmemory import MemoryFirestore

from tests.layout import REPO

SLACK = "https://hooks.slack.com/services/T000/B000/XXXXSECRET"
JOB = {"id": "j1", "tpu": "v4-8", "command": "train"}


def test_a_destination_names_a_secret_or_a_url_and_defaults_to_the_ends_and_blocks():
    d = Destination(secret="slack-alerts")
    assert d.events == list(DEFAULT_EVENTS) and d.pending_after == 3600 and d.label == "slack-alerts"
    assert Destination(secret="projects/p/secrets/slack-alerts", pending_after="2h").pending_after == 7200
    assert Destination(url=SLACK).label == "https://hooks.slack.com/…"
    for bad, field in (({}, "exactly one of secret"), ({"secret": "a", "url": SLACK}, "exactly one of secret"),
                       ({"secret": "no.dots"}, "not a Secret Manager secret id"),
                       ({"url": "ftp://x/secret-path"}, "not an http(s) URL"),
                       ({"secret": "a", "events": ["finished"]}, "events.0"),
                       ({"secret": "a", "pending_after": "soon"}, "pending_after")):
        with pytest.raises(ValidationError) as e:
            Destination.model_validate(bad)
        assert field in str(e.value), (bad, str(e.value))
    with pytest.raises(ValidationError) as e:
        Destination(url="ftp://hooks.example.com/secret-path")
    assert "secret-path" not in str(e.value).split("input_value")[0]  # the message itself masks the URL


def test_a_job_file_may_hold_a_url_but_nothing_published_may():
    """`tpuq submit` reads the file (url allowed: it stores it first); the jobs topic refuses it, naming the
    field, whoever publishes (gcloud, a bucket upload)."""
    one = JobFile.model_validate({"jobs": [{**JOB, "notify": {"url": SLACK}}]})  # one destination alone is a list
    assert one.jobs[0].notify[0].url == SLACK
    assert PublishedJob.model_validate({**JOB, "notify": [{"secret": "slack-alerts"}]}).notify[0].secret
    with pytest.raises(ValidationError) as e:
        PublishedJob.model_validate({**JOB, "notify": [{"secret": "ok"}, {"url": SLACK}]})
    assert "notify[1].url: a webhook URL is a credential" in str(e.value)
    with pytest.raises(ValidationError) as e:
        PublishedJob.model_validate({**JOB, "notify": [{"secret": f"s{i}"} for i in range(11)]})
    assert "at most 10 destinations" in str(e.value)
    with pytest.raises(ValidationError):
        Notification(event_id="x", event="failed", subject="j1", title="t", destinations=[{"url": SLACK}],
                     at=datetime.now(timezone.utc))


def test_a_fleet_with_a_url_is_never_stored():
    fleet = FleetFile.model_validate({"name": "f", "project": "p", "notify": [{"url": SLACK}],
                                      "tpus": [{"id": "a", "type": "v4-8", "zones": ["us-central2-b"]}]})
    db = MemoryFirestore()
    with pytest.raises(ValueError, match=r"notify\[0\].url"):
        save_fleet(db, fleet, datetime.now(timezone.utc))
    assert not list(db.collection("fleets").stream())


def test_the_format_follows_the_host_and_a_url_is_shown_masked():
    assert format_for_url(SLACK) is WebhookFormat.slack
    assert format_for_url("https://discord.com/api/webhooks/1/abc") is WebhookFormat.discord
    assert format_for_url("https://chat.googleapis.com/v1/spaces/A/messages?key=k&token=t") is WebhookFormat.google_chat
    assert format_for_url("http://127.0.0.1:8080/hook") is WebhookFormat.json
    assert masked_url(SLACK) == "https://hooks.slack.com/…" and masked_url("https://example.com") == "https://example.com"


def test_job_events_go_to_the_job_and_the_fleet_fleet_events_to_the_fleet_each_secret_once():
    job = [Destination(secret="mine", events=["failed"]), Destination(secret="team", events=["failed", "preempted"])]
    fleet = [Destination(secret="team"), Destination(secret="ops", events=["blocked", "leaked", "failed"])]
    assert [d.label for d in destinations_for(NotifyEvent.failed, job, fleet)] == ["mine", "team", "ops"]
    assert [d.label for d in destinations_for(NotifyEvent.preempted, job, fleet)] == ["team"]
    assert [d.label for d in destinations_for(NotifyEvent.blocked, job, fleet)] == ["team", "ops"]
    assert destinations_for(NotifyEvent.leaked, job, None) == []


def test_the_sender_is_the_janitor_as_deployed():
    """Secrets tpuq stores are shared with this account alone: it must be the one the janitor runs as."""
    services = yaml.safe_load((REPO / "infra" / "services.yaml").read_text())["services"]
    janitor = next(s for s in services if s["name"] == "janitor")
    assert janitor["service_account"] == SENDER_ACCOUNT_ID
