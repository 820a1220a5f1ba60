"""The janitor's pure rules, table by table (time passed in, no I/O)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tpuq.contracts.documents import TpuState
from tpuq.janitor import decide as d
from tests.janitor.factories import fleet, node, ours, qr

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)
F = fleet()


def member(qr_id, state, tpu_state=None, created=None, labels=None):
    resource = qr(qr_id, state, labels=ours(F) if labels is None else labels)
    return d.RaceMember(resource.name, resource, tpu_state, created)


def names(deletes):
    return sorted(d.short_node_name(x.name) for x in deletes)


class TestLosers:
    def test_no_winner_no_loser(self):
        race = [member("tpuq-r1-a", "WAITING_FOR_RESOURCES"), member("tpuq-r1-b", "ACCEPTED")]
        assert d.decide_losers(race, F, 1, False).deletes == []

    def test_pending_racers_lose_at_once_and_provisioning_waits(self):
        race = [member("tpuq-r1-a", "ACTIVE", "idle"), member("tpuq-r1-b", "WAITING_FOR_RESOURCES"),
                member("tpuq-r1-c", "ACCEPTED"), member("tpuq-r1-d", "PROVISIONING"),
                member("tpuq-r1-e", "DELETING"), member("tpuq-r1-f", "CREATING")]
        decision = d.decide_losers(race, F, 1, False)
        assert names(decision.deletes) == ["tpuq-r1-b", "tpuq-r1-c"]
        assert all(not x.force for x in decision.deletes)  # no node yet: no force needed
        assert [d.short_node_name(n) for n in decision.waiting] == ["tpuq-r1-d"]
        assert decision.surplus == []

    def test_demand_not_met_keeps_every_racer(self):
        race = [member("tpuq-r1-a", "ACTIVE"), member("tpuq-r1-b", "WAITING_FOR_RESOURCES")]
        assert d.decide_losers(race, F, 2, False).deletes == []

    def test_late_winner_is_surplus_unless_busy_or_other_jobs_pending(self):
        race = [member("tpuq-r1-a", "ACTIVE", "idle", NOW), member("tpuq-r1-b", "ACTIVE", None)]
        assert [d.short_node_name(m.name) for m in d.decide_losers(race, F, 1, False).surplus] == ["tpuq-r1-b"]
        assert d.decide_losers(race, F, 1, other_jobs_pending=True).surplus == []
        assert d.decide_losers(race, F, 2, False).surplus == []  # demand grew: both needed
        busy_late = [member("tpuq-r1-a", "ACTIVE", "idle", NOW), member("tpuq-r1-b", "ACTIVE", "busy", NOW)]
        assert [d.short_node_name(m.name) for m in d.decide_losers(busy_late, F, 1, False).surplus] == ["tpuq-r1-a"]
        both_busy = [member("tpuq-r1-a", "ACTIVE", "busy", NOW), member("tpuq-r1-b", "ACTIVE", "busy", NOW)]
        assert d.decide_losers(both_busy, F, 1, False).surplus == []

    def test_count_still_caps_a_withdrawn_requests_race(self):
        # The scheduler withdraws a request on its first ACTIVE event; a second that won in the same instant is
        # surplus all the same, and the one serving the job stays.
        race = [member("tpuq-r1-a", "ACTIVE", "idle", NOW), member("tpuq-r1-b", "ACTIVE", "busy", NOW),
                member("tpuq-r1-c", "ACCEPTED")]
        decision = d.decide_losers(race, F, 1, False)
        assert [d.short_node_name(m.name) for m in decision.surplus] == ["tpuq-r1-a"]
        assert names(decision.deletes) == ["tpuq-r1-c"]

    @pytest.mark.parametrize("classified, deleted", [(False, ["tpuq-r1-c"]), (True, ["tpuq-r1-c", "tpuq-r1-f"])])
    def test_failed_loser_waits_for_the_claimers_classification(self, classified, deleted):
        race = [member("tpuq-r1-a", "ACTIVE", "busy", NOW), member("tpuq-r1-c", "SUSPENDED"),
                member("tpuq-r1-f", "FAILED")]
        names_ = {race[2].name} if classified else set()
        assert names(d.decide_losers(race, F, 1, False, names_).deletes) == deleted

    def test_foreign_racer_is_never_a_loser(self):
        race = [member("tpuq-r1-a", "ACTIVE"), member("tpuq-r1-b", "ACCEPTED", labels={}),
                member("other-r1-c", "ACCEPTED")]
        assert d.decide_losers(race, F, 1, False).deletes == []


def tpu(tid, state, idle_for=None, entry="v4pool", fleet_name="f1"):
    since = NOW - timedelta(seconds=idle_for) if idle_for is not None else None
    return d.TpuDoc(tid, fleet_name, entry, state, since, f"projects/p/locations/z/queuedResources/{tid}")


class TestIdle:
    def test_quarantined_tpu_goes_at_once_and_is_not_kept_warm(self):
        f = fleet(idle=600, keep_warm=1)
        suspect = d.TpuDoc("q", "f1", "v4pool", "idle", NOW, "projects/p/locations/z/queuedResources/q",
                           quarantined=True)
        got = d.decide_idle([suspect, tpu("w", "idle", 1)], f, NOW)
        assert [t.id for t in got] == ["q"]  # the healthy one is the warm one, and not yet expired anyway

    def test_expired_idle_is_deleted_busy_never(self):
        f = fleet(idle=2)
        got = d.decide_idle([tpu("a", "idle", 3), tpu("b", "idle", 1), tpu("c", "busy", 99)], f, NOW)
        assert [t.id for t in got] == ["a"]

    def test_keep_warm_keeps_the_most_recently_used(self):
        f = fleet(idle=2, keep_warm=1)
        got = d.decide_idle([tpu("a", "idle", 30), tpu("b", "idle", 10)], f, NOW)
        assert [t.id for t in got] == ["a"]

    def test_busy_tpus_count_towards_keep_warm(self):
        f = fleet(idle=2, keep_warm=1)
        assert [t.id for t in d.decide_idle([tpu("a", "idle", 30), tpu("b", "busy")], f, NOW)] == ["a"]
        assert d.decide_idle([tpu("a", "idle", 30), tpu("b", "deleting")], f, NOW) == []

    def test_entry_timeout_overrides_fleet_default(self):
        f = fleet(idle=600, idle_timeout_seconds=5)
        assert [t.id for t in d.decide_idle([tpu("a", "idle", 6)], f, NOW)] == ["a"]
        assert d.decide_idle([tpu("a", "idle", 4)], f, NOW) == []

    def test_default_timeout_is_the_fleets(self):
        f = fleet()
        assert d.decide_idle([tpu("a", "idle", 599)], f, NOW) == []
        assert [t.id for t in d.decide_idle([tpu("a", "idle", 600)], f, NOW)] == ["a"]

    def test_other_fleets_tpus_are_not_touched(self):
        assert d.decide_idle([tpu("a", "idle", 9999, fleet_name="f2")], fleet(idle=2), NOW) == []


class TestDead:
    @pytest.mark.parametrize("state,classified,dead", [
        ("SUSPENDED", False, True),      # the janitor's own: deleted at once
        ("FAILED", True, True),          # the claimer recorded its class: the janitor may delete it too
        ("FAILED", False, False),        # not classified yet: the claimer's, never deleted under its feet
        ("ACTIVE", False, False), ("PROVISIONING", False, False), ("DELETING", False, False),
        ("ACCEPTED", False, False)])
    def test_queued_resource_states(self, state, classified, dead):
        resource = qr("tpuq-r1-a", state, labels=ours(F))
        got = d.decide_dead([resource], F, {resource.name} if classified else set())
        assert bool(got) is dead and all(x.force for x in got)

    def test_classified_failures_are_failed_records_with_a_class(self):
        docs = [{"name": "a", "state": "FAILED", "failure_class": "capacity"}, {"name": "b", "state": "FAILED"},
                {"name": "c", "state": "WAITING_FOR_RESOURCES", "failure_class": "capacity"},
                {"name": "d", "state": "GONE", "failure_class": "zone_quota"}]
        assert d.classified_failures(docs) == {"a"}

    def test_preempted_node(self):
        got = d.decide_dead([node("tpuq-r1-a", "PREEMPTED", labels=ours(F)), node("tpuq-r1-b", "READY",
                                                                                  labels=ours(F))], F)
        assert names(got) == ["tpuq-r1-a"]

    def test_foreign_dead_resources_stay(self):
        assert d.decide_dead([qr("tpuq-x", "SUSPENDED"), node("mine-x", "PREEMPTED", labels=ours(F))], F) == []


class TestOrphans:
    def test_grace_counts_from_first_sight(self):
        f = fleet(grace=60)
        orphan = qr("tpuq-lost-us-central2-b", "ACTIVE", labels=ours(f))
        first = d.decide_orphans([orphan], set(), {}, f, NOW)
        assert first.deletes == [] and first.first_seen == {orphan.name: NOW}
        later = d.decide_orphans([orphan], set(), first.first_seen, f, NOW + timedelta(seconds=60))
        assert names(later.deletes) == ["tpuq-lost-us-central2-b"] and later.first_seen == {}

    def test_known_foreign_and_undeletable_are_skipped(self):
        f = fleet(grace=0)
        listed = [qr("tpuq-known", "ACTIVE", labels=ours(f)), qr("tpuq-prov", "PROVISIONING", labels=ours(f)),
                  qr("tpuq-nolabel", "ACTIVE"), qr("other-x", "ACTIVE", labels=ours(f))]
        assert d.decide_orphans(listed, {"tpuq-known"}, {}, f, NOW).deletes == []

    def test_node_goes_with_its_queued_resource(self):
        f = fleet(grace=0)
        q = qr("tpuq-lost", "ACTIVE", labels=ours(f))
        n = node("tpuq-lost", "READY", labels=ours(f), queued_resource=q.name)
        lone = node("tpuq-lone", "READY", labels=ours(f))
        assert names(d.decide_orphans([q, n, lone], set(), {}, f, NOW).deletes) == ["tpuq-lone", "tpuq-lost"]


def test_dead_node_goes_with_its_queued_resource_when_both_were_read():
    q = qr("tpuq-r1-a", "SUSPENDED", labels=ours(F))
    n = node("tpuq-r1-a", "PREEMPTED", labels=ours(F), queued_resource=q.name)
    assert names(d.decide_dead([q, n], F)) == ["tpuq-r1-a"] and d.decide_dead([q, n], F)[0].name == q.name
    assert names(d.decide_dead([n], F)) == ["tpuq-r1-a"]  # alone, the node itself is deleted


class TestRacesToSettle:
    @pytest.mark.parametrize("case, racers, expected", [
        ("a winner and a loser", [("tpuq-r1-a", "ACTIVE"), ("tpuq-r1-b", "WAITING_FOR_RESOURCES")], ["r1"]),
        ("no winner yet", [("tpuq-r1-a", "ACCEPTED"), ("tpuq-r1-b", "WAITING_FOR_RESOURCES")], []),
        ("a winner alone: nobody to lose", [("tpuq-r1-a", "ACTIVE")], []),
    ])
    def test_only_races_with_a_winner_and_a_loser(self, case, racers, expected):
        present = {q.name: q for q in (qr(i, s, labels=ours(F)) for i, s in racers)}
        assert list(d.races_to_settle(present, {})) == expected, case

    def test_the_request_comes_from_the_claimer_record_before_the_label(self):
        a, b = qr("tpuq-x-a", "ACTIVE", labels={}), qr("tpuq-x-b", "ACCEPTED", labels={})
        assert d.races_to_settle({a.name: a, b.name: b}, {a.name: "r9", b.name: "r9"}) == {"r9": [a.name, b.name]}

    def test_race_names_skip_gone_and_nameless_records(self):
        docs = [{"name": "qa", "state": "ACTIVE"}, {"name": "qb", "state": "GONE"}, {"state": "ACCEPTED"}]
        assert d.race_names("q0", "r1", docs) == {"q0": "r1", "qa": "r1"}
        assert d.race_names("q0", None, docs) == {"q0": None}


class TestFinishDeletes:
    @pytest.mark.parametrize("case, state, since, observed, gone, resent", [
        ("NOT_FOUND: recorded gone", TpuState.deleting, 0, None, ["t1"], []),
        ("still there after the resend delay: sent again", TpuState.deleting, 61, "ACTIVE", [], ["t1"]),
        ("still there, too soon", TpuState.deleting, 30, "ACTIVE", [], []),
        ("already deleting at the API: left alone", TpuState.deleting, 600, "DELETING", [], []),
        ("not marked deleting", TpuState.idle, 600, None, [], []),
    ])
    def test_marked_deletes_are_seen_through(self, case, state, since, observed, gone, resent):
        resource = qr("tpuq-r1-a", observed, labels=ours(F)) if observed else None
        tpu = d.TpuDoc("t1", F.name, "v4pool", state, None, deleting_since=NOW - timedelta(seconds=since))
        decision = d.decide_finish_deletes([tpu], {"t1": "q"}, {"q": resource}, NOW)
        assert decision.gone == gone, case
        assert ["t1" for _ in decision.resend] == resent, case

    def test_a_resource_that_was_not_read_concludes_nothing(self):
        tpu = d.TpuDoc("t1", F.name, "v4pool", TpuState.deleting, None, deleting_since=NOW - timedelta(hours=1))
        assert d.decide_finish_deletes([tpu], {"t1": "q"}, {}, NOW) == d.FinishDecision()


@pytest.mark.parametrize("kind, outcome, judged", [
    ("ended", "preempted", True), ("ended", "infra_failed", True), ("ended", "succeeded", False),
    ("ended", "failed", False), ("started", None, False),
])
def test_only_attempts_ended_on_infrastructure_get_their_tpu_judged(kind, outcome, judged):
    from tpuq.contracts.messages import AttemptEvent

    event = AttemptEvent(kind=kind, job_id="j", attempt=1, attempt_id="j-1", node="n", outcome=outcome, at=NOW)
    assert d.attempt_end_to_judge(event) is judged


@pytest.mark.parametrize("last, due", [(None, True), (NOW - timedelta(seconds=599), False),
                                       (NOW - timedelta(seconds=600), True)])
def test_orphan_scan_is_rate_limited(last, due):
    assert d.orphan_scan_due(last, NOW, 600) is due


def test_known_ids_cover_the_claimer_records_and_every_name_a_tpu_is_known_by():
    claimer = [{"qr_id": "q1", "node": "projects/p/locations/z/nodes/n1"}, {"qr_id": "q2"}]
    qr3 = "projects/p/locations/z/queuedResources/q3"
    tpus = [d.TpuDoc("t1", F.name, "v4pool", TpuState.idle, None, queued_resource=qr3,
                     name="projects/p/locations/z/nodes/n3")]
    assert d.known_ids(claimer, tpus) == {"q1", "n1", "q2", "t1", "q3", "n3"}


@pytest.mark.parametrize("kind, queued_resource, judged", [
    ("ACTIVE", "q", True), ("FAILED", "q", True), ("SUSPENDED", "q", True), ("GONE", "q", False),
    ("NODE_HEALTH", "q", False), ("ACTIVE", "", False),  # no queued resource: a node tpuq did not create
])
def test_only_fleet_events_about_a_queued_resource_get_their_race_settled(kind, queued_resource, judged):
    from tpuq.contracts.messages import FleetEvent

    event = FleetEvent(kind=kind, fleet=F.name, queued_resource=queued_resource, zone="us-central2-b", type="v4-8",
                       at=NOW)
    assert d.fleet_event_to_judge(event) is judged


def test_surplus_needs_more_active_racers_than_asked_for_and_takes_only_absent_or_idle_tpus():
    race = [member("tpuq-r1-a", "ACTIVE"), member("tpuq-r1-b", "ACTIVE"), member("tpuq-r1-c", "ACCEPTED")]
    assert d.surplus_possible(race, 1) and not d.surplus_possible(race, 2)
    assert d.may_take_surplus(None) and d.may_take_surplus({"state": "idle"})
    assert not d.may_take_surplus({"state": "busy"}) and not d.may_take_surplus({"state": "deleting"})


class TestReapAndDrainMarks:
    def test_an_idle_tpu_marked_deleting_is_deleted_only_when_read_and_ours(self):
        mine = qr("tpuq-r1-a", "ACTIVE", labels=ours(F))
        assert d.decide_reap(mine.name, mine, F) == d.ReapDecision(delete=d.Delete(mine, mine.name, True, "idle timeout"))
        assert "not found" in d.decide_reap(mine.name, None, F).gone_reason
        assert "not found" in d.decide_reap(None, None, F).gone_reason
        foreign = qr("tpuq-r1-b", "ACTIVE", labels={})
        decision = d.decide_reap(foreign.name, foreign, F)
        assert decision.delete is None and "left alone" in decision.gone_reason

    def test_idle_delete_reason_names_the_timeout_or_the_pause(self):
        tpu = d.TpuDoc("t1", F.name, "v4pool", TpuState.idle, NOW)
        assert d.idle_delete_reason(tpu, F, paused=False) == "idle longer than 600 s"
        assert d.idle_delete_reason(tpu, F, paused=True) == "idle while the fleet is paused"

    def test_a_drain_marks_idle_and_busy_tpus_only(self):
        tpus = [d.TpuDoc(s.value, F.name, "v4pool", s, None) for s in TpuState]
        assert {t.id for t in d.drain_marks(tpus)} == {TpuState.idle.value, TpuState.busy.value}
        assert d.drain_may_mark({"state": "busy"}) and not d.drain_may_mark(None)
        assert not d.drain_may_mark({"state": "deleting"})
