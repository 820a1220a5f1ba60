"""A job published past `tpuq submit` (gcloud, a script) that is too large to store is refused at intake, once, with
the field and the reason, and never retried: Firestore refuses a document over 1 MiB on every write
(production-facts.md, "Firestore document size"), so before the job's limits it was redelivered until Pub/Sub
dead-lettered it ("exhausted"), with no reason anywhere. The in-memory Firestore refuses such a write as Firestore
does (tests/contract/test_store_contract.py), so this fails here, not only in production."""

from __future__ import annotations

from tpuq.contracts import store
from tpuq.contracts.jobspec import MAX_COMMAND_BYTES, MAX_ENV_VALUE_BYTES


def test_a_job_over_one_mib_is_stored_rejected_with_its_reason(sched):
    big_env = {f"V{i}": "x" * MAX_ENV_VALUE_BYTES for i in range(40)}  # 1.25 MiB: no Firestore document holds it
    sched.deliver("jobs", {"id": "huge", "tpu": "v4-8", "command": "train", "env": big_env}, message_id="7", times=2)
    job = sched.job("huge")
    assert job["state"] == "rejected" and "env" in job["reason"] and "1 MiB" in job["reason"]
    assert "spec" not in job
    [letter] = sched.all(store.DEAD_LETTERS).values()
    assert letter["field"] == "env" and "together" in letter["reason"]
    assert sched.drain("capacity") == [] and sched.drain("assignments") == []


def test_a_command_over_its_limit_is_a_dead_letter_naming_the_field(sched):
    sched.deliver("jobs", {"tpu": "v4-8", "command": "x" * (MAX_COMMAND_BYTES + 1)}, message_id="8")
    [letter] = sched.all(store.DEAD_LETTERS).values()
    assert letter["field"] == "command" and "at most 65,536" in letter["reason"]
    assert sched.all(store.JOBS).get("job-8", {}).get("state") in (None, "rejected")
