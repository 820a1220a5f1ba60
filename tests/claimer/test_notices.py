"""The claimer's notifications (tpuq.claimer.notices): the fleet blocked, told once at the transition; the budget
reached, once a day; the grant's end near, once per warning; nothing for a fleet without `notify`."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from tpuq.capacity.brakes import DayUse
from tpuq.claimer import notices
from tpuq.contracts.documents import FleetStatus
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.messages import CapacityRequest, Tick
from tpuq.runtime.service import utcnow

from .conftest import claimer_app, fleet_data, scenario_data

ZONES = ["us-central2-a", "us-central2-b"]
NOW = datetime(2026, 12, 20, 12, tzinfo=timezone.utc)
HOOK = {"secret": "ops-hook", "events": ["blocked", "budget", "grant_end"]}


def fleet(**extra) -> FleetFile:
    return FleetFile.model_validate(fleet_data(ZONES, **{"notify": [HOOK], **extra}))


def told(h) -> list[dict]:
    return [json.loads(m.data) for m in h.publisher.take(h.clients.settings.topic_path("notifications"))]


def request(rid: str) -> CapacityRequest:
    return CapacityRequest(request_id=rid, fleet="race", types=["v4-32"], count=1)


# ------------------------------------------------------------------------------------------- through handlers


def test_a_fleet_blocked_for_billing_is_told_once_and_again_by_a_new_instance_soon_after(claimer):
    h = claimer(scenario_data(ZONES, billing={"disabled": True, "permission_denied": True}))
    h.fleet(fleet_data(ZONES, notify=[HOOK]))
    h.push("/push/capacity", request("job-1"))
    h.push("/push/capacity", request("job-2"))
    h.push("/push/ticks", Tick(seq=1))
    h.push("/push/ticks", Tick(seq=2))
    [notice] = told(h)
    assert notice["event"] == "blocked" and notice["event_id"].startswith("blocked:race:billing:")
    assert notice["text"].startswith("billing is disabled on project tpuq-test")
    assert [d["secret"] for d in notice["destinations"]] == ["ops-hook"]
    # Another instance (or this one after a crash between the status write and the publish) soon after: the same id.
    h.app = claimer_app(h.clients)
    h.push("/push/ticks", Tick(seq=3))
    assert [n["event_id"] for n in told(h)] == [notice["event_id"]]


def test_the_grant_end_is_told_once_per_warning_and_nothing_without_notify(claimer):
    h = claimer(scenario_data(ZONES))
    last_day = (utcnow() + timedelta(days=5)).date().isoformat()
    h.fleet(fleet_data(ZONES, notify=[HOOK], grant_expires=last_day))
    h.push("/push/ticks", Tick(seq=1))
    h.push("/push/ticks", Tick(seq=2))
    [notice] = told(h)
    assert notice["event_id"] == "grant_end:race:7" and "6 days left" in notice["title"]
    h.fleet(fleet_data(ZONES, grant_expires=last_day))  # no notify: nobody to tell
    h.app = claimer_app(h.clients)
    h.push("/push/ticks", Tick(seq=3))
    assert told(h) == []


# ----------------------------------------------------------------------------------------------------- pure


def test_a_block_is_named_by_its_class_and_its_start():
    f = fleet()
    status = FleetStatus(fleet="race", blocked="billing is disabled", blocked_version=f.version,
                         blocked_message="Billing account disabled [code 7]", blocked_at=NOW)
    notice = notices.blocked_notice(f, status, NOW)
    assert notice.event_id == "blocked:race:billing:20261220T120000Z" and notice.fields["class"] == "billing"
    assert notices.blocked_notice(fleet(notify=[]), status, NOW) is None
    assert notices.blocked_notice(f, FleetStatus(fleet="race"), NOW) is None  # unblocked


def test_the_budget_is_told_once_a_day_when_no_slice_fits():
    f = fleet(budget={"vm_hours_per_day": 100})
    assert notices.budget_notice(f, DayUse(vm_hours=50, alive_hosts=4), NOW) is None
    notice = notices.budget_notice(f, DayUse(vm_hours=95, alive_hosts=4), NOW)
    assert notice.event_id == "budget:race:2026-12-20" and "over budget for today" in notice.text


def test_the_grant_warnings():
    assert [notices.grant_mark(d) for d in (30, 8, 7, 3, 1, 0, -4, None)] == [None, None, 7, 7, 1, 0, 0, None]
    f = fleet(grant_expires="2026-12-20")
    assert notices.grant_notice(f, NOW).title == "fleet race: the grant ends soon (today is its last day)"
    assert notices.grant_notice(f, NOW + timedelta(days=1)).event_id == "grant_end:race:0"


def test_an_instance_tells_each_event_once():
    published = []

    class Ctx:
        def publish(self, topic, message, **attributes):
            published.append((topic, message.event_id))

    memory: set[str] = set()
    notice = notices.grant_notice(fleet(grant_expires="2026-12-21"), NOW)
    notices.tell(Ctx(), notice, memory)
    notices.tell(Ctx(), notice, memory)
    assert published == [("notifications", "grant_end:race:7")]  # 2 days left: under the 7-day warning
