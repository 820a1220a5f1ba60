"""A pass parses each stored pending job once per stored version (`tpuq.runtime.versioned`): unchanged jobs
are not copied and validated again, and a job written since is read as written."""

from __future__ import annotations

from datetime import timedelta

from tpuq.contracts import store
from tpuq.contracts.documents import JobState
from tpuq_dev.inmemory import MemoryFirestore
from tpuq.contracts.messages import Tick
from tpuq.scheduler.decide import queued
from tpuq.scheduler.scheduling import scheduling_pass
from tpuq.runtime.versioned import Versioned, versioned

from tests.scheduler.conftest import active, fleet_file
from tests.scheduler.test_long_queue import NOW, context, store_pending


def test_a_pass_over_unchanged_jobs_parses_none_of_them_again(sched):
    store_pending(sched.db, 30, "v4-8", "normal", "v4")
    kept = versioned(sched.db, "queued job", queued)
    scheduling_pass(context(sched), fleet_file())  # parses all 30; asks for capacity: writes some of them
    versions = {s.id: s.update_time for s in sched.db.collection(store.JOBS).stream()}
    scheduling_pass(context(sched), fleet_file())  # parses those written again (new versions)
    parsed = kept.misses
    assert parsed >= 30
    report = scheduling_pass(context(sched), fleet_file())
    assert report.jobs_read == 30
    written = {s.id for s in sched.db.collection(store.JOBS).stream() if s.update_time != versions[s.id]}
    assert not written, "the later passes wrote nothing"
    assert kept.misses == parsed  # the same 30 stored versions: nothing copied or validated again
    assert kept.hits >= 30


def test_a_job_written_since_the_last_pass_is_planned_as_written(sched):
    store_pending(sched.db, 3, "v6e-8", "normal", "job")
    sched.deliver("ticks", Tick(seq=1))  # every job parsed (and kept) as a v6e-8 job
    ref = sched.db.collection(store.JOBS).document("job-00001")
    doc = ref.get().to_dict()
    # Written again (another type): a new stored version, which the next pass must read, not the kept parse.
    ref.update({"spec": {**doc["spec"], "tpu": ["v4-8"]}, "types": ["v4-8"], "updated_at": NOW + timedelta(minutes=1)})
    sched.deliver("fleet-events", active("n1"))  # a v4-8 idles: only the rewritten job fits it
    assert sched.job("job-00001")["state"] == JobState.assigned
    assert sched.job("job-00000")["state"] == sched.job("job-00002")["state"] == JobState.pending


class _Snap:
    def __init__(self, doc_id: str, doc: dict, version: int) -> None:
        self.id, self._doc, self.update_time = doc_id, doc, version

    def to_dict(self) -> dict:
        return dict(self._doc)


def test_a_kept_parse_is_per_version_per_store_and_a_failed_parse_is_not_kept():
    calls = []

    def parse(doc_id, doc):
        calls.append((doc_id, doc["n"]))
        if doc["n"] < 0:
            raise ValueError("bad")
        return doc["n"] * 10

    kept = Versioned(parse)
    assert kept.get(_Snap("a", {"n": 1}, 1))[1] == 10
    assert kept.get(_Snap("a", {"n": 1}, 1))[1] == 10
    assert kept.get(_Snap("a", {"n": 2}, 2))[1] == 20  # a new version is parsed
    assert calls == [("a", 1), ("a", 2)]
    for _ in range(2):
        try:
            kept.get(_Snap("b", {"n": -1}, 1))
        except ValueError:
            pass
    assert calls[-2:] == [("b", -1), ("b", -1)]  # raised both times: never kept
    assert kept.get(_Snap("c", {"n": 3}, None))[1] == 30 and kept.get(_Snap("c", {"n": 3}, None))[1] == 30
    assert calls[-2:] == [("c", 3), ("c", 3)]  # no version (not a stored read): parsed every time
    one, other = MemoryFirestore(), MemoryFirestore()
    assert versioned(one, "k", parse) is versioned(one, "k", parse)
    assert versioned(one, "k", parse) is not versioned(other, "k", parse)


def test_the_claimers_load_reads_a_rewritten_queued_resource_as_written():
    from dataclasses import replace

    from tpuq.claimer.statestore import StateWriter, load_state
    from tpuq.contracts.documents import QrRecord

    db = MemoryFirestore()
    fleet = fleet_file()
    qr = QrRecord(qr_id="tpuq-r-1-a", fleet=fleet.name, project="tpuq-local", request_id="r-1", entry_id="v4",
                  zone="us-central2-b", type="v4-8", spot=True, generation=1, state="WAITING_FOR_RESOURCES",
                  created_at=NOW, updated_at=NOW)
    writer = StateWriter(db)
    writer.put_qr(qr)
    first = load_state(db, fleet).qrs["tpuq-r-1-a"]
    assert load_state(db, fleet).qrs["tpuq-r-1-a"] is first  # the same stored version: parsed once
    writer.put_qr(replace(qr, state="PROVISIONING", updated_at=NOW + timedelta(minutes=1)))
    assert load_state(db, fleet).qrs["tpuq-r-1-a"].state == "PROVISIONING"
    writer.put_qr(replace(qr, state="GONE", updated_at=NOW + timedelta(minutes=2)))
    assert "tpuq-r-1-a" not in load_state(db, fleet).qrs  # no longer live: not read at all


def test_the_least_lately_read_go_first_and_an_older_version_never_replaces_a_newer_one():
    kept = Versioned(lambda doc_id, doc: doc["n"], limit=2)
    kept.get(_Snap("a", {"n": 1}, 1))
    kept.get(_Snap("b", {"n": 2}, 1))
    kept.get(_Snap("a", {"n": 1}, 1))  # read lately: kept
    kept.get(_Snap("c", {"n": 3}, 1))  # over the limit: "b" goes
    assert list(kept._kept) == ["a", "c"]
    kept.get(_Snap("a", {"n": 5}, 3))
    kept.get(_Snap("a", {"n": 4}, 2))  # a slow reader of an older version
    assert kept.get(_Snap("a", {"n": 5}, 3))[1] == 5 and kept.misses == 5


def test_a_pass_changes_none_of_the_documents_and_parses_it_keeps(sched):
    import copy

    store_pending(sched.db, 12, "v4-8", "normal", "job")
    kept = versioned(sched.db, "queued job", queued)
    scheduling_pass(context(sched), fleet_file())  # parsed and kept; asks for capacity (writes them)
    scheduling_pass(context(sched), fleet_file())  # the written versions parsed and kept
    before = copy.deepcopy(dict(kept._kept))
    sched.deliver("fleet-events", active("n1"))  # passes that assign, reading the kept ones
    sched.deliver("fleet-events", active("n2"))
    assert sum(1 for j in sched.db.collection(store.JOBS).stream() if j.get("state") == JobState.assigned) == 2
    same = [path for path, (version, _, _) in before.items() if kept._kept[path][0] == version]
    assert same, "some jobs kept their stored version through the passes"
    for path in same:
        assert kept._kept[path][1:] == before[path][1:]  # the kept document and parse, as read
