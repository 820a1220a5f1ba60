"""A job whose logs or status objects GCS refuses is never reported `succeeded` without saying so.

Real sshd worker hosts, the real supervisor, fake-gcs-server: a bucket that does not exist refuses every
upload, as a bucket the workers' account may not write does in production (404 here, 403 there: the
supervisor treats both alike, and reports the reason it was given).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tpuq.contracts import gcslayout
from tpuq.executor.executor import Executor
from tpuq.executor.objects import GcsObjectStore
from tpuq.executor.outcome import Decided, NodeState, WorkerStatus, decide_outcome
from tpuq.executor.pins import InMemoryPinStore
from tpuq.executor.ssh import ConnectPolicy, SshLogin
from tpuq.executor.workerspec import WorkerSettings
from tpuq.contracts.messages import AttemptOutcome

from .conftest import wait_until
from .factories import T0, make_assignment


def executor_for(fake_gcs, ssh_identity, host_keys, status_bucket: str, **settings) -> Executor:
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": fake_gcs.base_url})
    return Executor(
        ssh_login=lambda: SshLogin(ssh_identity.user), ssh_key=lambda: ssh_identity.pkey, pin_store=InMemoryPinStore(), host_keys=host_keys,
        objects=GcsObjectStore(client), clock=lambda: T0,
        settings=WorkerSettings.for_emulator(fake_gcs.base_url, log_flush_seconds=0.2, cancel_grace_seconds=1.0,
                                             stale_grace_seconds=1.0, libtpu_lockfile="/tmp/libtpu_lockfile",
                                             status_bucket=status_bucket, **settings),
        connect_policy=ConnectPolicy(attempts=2, connect_timeout=5), sleep=lambda s: None,
        failure_grace=timedelta(seconds=30))


def test_logs_that_could_not_be_written_are_named_in_the_succeeded_detail(fake_gcs, ssh_identity, start_hosts, bucket, host_keys):
    missing = f"gone-{uuid.uuid4().hex[:10]}"  # the job's bucket: the workers cannot write it
    executor = executor_for(fake_gcs, ssh_identity, host_keys, status_bucket=bucket)  # the runner bucket: writable
    _, endpoints = start_hosts(2)
    a = make_assignment(endpoints=endpoints, command="echo hello", bucket=missing)
    assert executor.start_attempt(a).started
    decision = wait_until(lambda: _decided(executor.read_outcome(a, node_state=NodeState.ready)), 60, "an outcome")
    assert decision.outcome is AttemptOutcome.succeeded
    assert decision.detail.startswith(f"all 2 workers exited 0, but the logs of workers 0, 1 could not be written "
                                      f"to gs://{missing}: GCS 404"), decision.detail
    status = fake_gcs.read_json(bucket, gcslayout.worker_status_name(a.job_id, a.attempt, 0))
    assert status["log_error"].startswith(f"could not be written to gs://{missing}: GCS 404")
    assert status["log_chunks"] == 0


def test_a_status_object_that_could_not_be_written_ends_the_attempt_with_the_reason(fake_gcs, ssh_identity,
                                                                                      start_hosts, bucket, host_keys):
    missing = f"gone-{uuid.uuid4().hex[:10]}"
    # The workers write status objects where they cannot (in production: the runner bucket without the grant);
    # the executor reads the (existing, empty) runner bucket.
    executor = executor_for(fake_gcs, ssh_identity, host_keys, status_bucket=missing, status_upload_deadline_seconds=1.0)
    reader = executor_for(fake_gcs, ssh_identity, host_keys, status_bucket=bucket)
    _, endpoints = start_hosts(1)
    a = make_assignment(endpoints=endpoints, command="echo hello", bucket=missing, hosts=1)
    assert executor.start_attempt(a).started
    probes = wait_until(lambda: (p := executor.probe_attempt(a)) and all(x.status_error for x in p.values()) and p,
                        60, "the supervisor to give up on its status object")
    assert not any(p.lost for p in probes.values())  # it left a status, only not in GCS
    unwritable = {w: p.status_error for w, p in probes.items()}
    decision = reader.read_outcome(a, node_state=NodeState.ready, unwritable_statuses=unwritable)
    assert decision.outcome is AttemptOutcome.infra_failed
    name = gcslayout.worker_status_name(a.job_id, a.attempt, 0)
    assert decision.detail.startswith(f"worker 0: the status object gs://{missing}/{name} could not be written: "
                                      "GCS 404"), decision.detail


def _decided(decision):
    return decision if isinstance(decision, Decided) else None


def _status(worker_id: int, **fields) -> WorkerStatus:
    return WorkerStatus(**{"worker_id": worker_id, "attempt_id": "a", "ended_at": T0, "exit_code": 0, **fields})


def test_log_failures_are_grouped_by_reason_and_come_before_the_tail():
    statuses = {0: _status(0, log_error="could not be written to gs://b: GCS 403: denied"),
                1: _status(1, log_error="could not be written to gs://b: GCS 403: denied"),
                2: _status(2, exit_code=1, tail="boom\n")}
    decision = decide_outcome(worker_count=3, statuses=statuses, node_state=NodeState.ready, now=T0)
    assert decision.outcome is AttemptOutcome.failed
    head, tail = decision.detail.split("\n", 1)
    assert head.endswith("but the logs of workers 0, 1 could not be written to gs://b: GCS 403: denied")
    assert tail.endswith("boom")
    clean = decide_outcome(worker_count=1, statuses={0: _status(0)}, node_state=NodeState.ready, now=T0)
    assert clean.detail == "the 1 worker exited 0"


def test_an_unwritable_status_of_a_worker_that_did_report_is_ignored():
    decision = decide_outcome(worker_count=1, statuses={0: _status(0)}, node_state=NodeState.ready, now=T0,
                              unwritable_statuses={0: "stale"})
    assert decision.outcome is AttemptOutcome.succeeded
