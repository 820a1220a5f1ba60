"""The janitor's `leaked` notification (tpuq.janitor.leaked): an owned resource no record names is told of once,
by its name, when the orphan scan deletes it; nothing when the fleet has no destination for it."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from tpuq.janitor import leaked
from tpuq.janitor.decide import Delete
from tpuq.runtime.fleetstore import save_fleet
from tpuq.runtime.settings import Settings
from tpuq_dev.faketpu.control import FakeTpuControl

from .conftest import ACTIVE_AFTER, WIN_ZONE, Stack, janitor_app, make_fleet, memory_clients

HOOK = {"secret": "ops-hook", "events": ["leaked"]}


def stack(fake_tpu, **fleet_fields):
    project = f"p-{uuid.uuid4().hex[:10]}"
    fleet = make_fleet(project, **fleet_fields)
    settings = Settings(project=project, tpu_endpoint=fake_tpu.url, orphan_scan_seconds=3600, backstop_seconds=0)
    clients = memory_clients(settings)
    save_fleet(clients.firestore, fleet, datetime.now(timezone.utc))
    tpu = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                           client_options=ClientOptions(api_endpoint=fake_tpu.url))
    s = Stack(fleet, clients.firestore, tpu, FakeTpuControl(fake_tpu.url), fake_tpu.clock,
              janitor_app(settings, clients), [])

    def told() -> list[dict]:
        return [json.loads(m.data) for m in clients.publisher.take(settings.topic_path("notifications"))]

    return s, told


def test_a_leaked_resource_is_told_once_by_its_name(fake_tpu):
    s, told = stack(fake_tpu, notify=[HOOK])
    orphan = s.create_owned("lost", WIN_ZONE, record=False)  # ours, but no Firestore document names it
    s.advance(ACTIVE_AFTER + 1)
    s.tick()  # delivered twice: the second finds the scan done (rate-limited)
    assert s.deleted_ids() == [orphan.rsplit("/", 1)[-1]]
    [notice] = told()
    assert notice["event"] == "leaked" and notice["event_id"] == f"leaked:{s.fleet.name}:{orphan}"
    assert notice["fields"]["zone"] == WIN_ZONE and "queued resource" in notice["title"]
    assert [d["secret"] for d in notice["destinations"]] == ["ops-hook"]


def test_without_a_destination_for_it_nothing_is_told(fake_tpu):
    s, told = stack(fake_tpu, notify=[{"secret": "ops-hook"}])  # the default events: not `leaked`
    s.create_owned("lost", WIN_ZONE, record=False)
    s.advance(ACTIVE_AFTER + 1)
    s.tick()
    assert len(s.deletes()) == 1 and told() == []


def test_leaked_notices_are_pure_and_named_by_the_resource():
    fleet = make_fleet("p1", notify=[HOOK])
    name = "projects/p1/locations/us-central2-b/nodes/tpuq-x"
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    [notice] = leaked.leaked_notices(fleet, [Delete({"name": name, "state": "READY"}, name, True, "orphan")], now)
    again = leaked.leaked_notices(fleet, [Delete({"name": name}, name, True, "orphan")], now + timedelta(hours=1))
    assert notice.event_id == again[0].event_id == f"leaked:jf:{name}" and notice.title.endswith("in us-central2-b")
