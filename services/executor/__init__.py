"""The executor's core: run an attempt on every worker of a TPU and tell how it ended.

Service-facing API (see `tpuq.executor.executor` for the flow):

    Executor(ssh_login=, ssh_key=, pin_store=, host_keys=, objects=, clock=, settings=WorkerSettings(), ...)
        ssh_login: () -> SshLogin(user, transport), read per pool; the service's is `SshLogin.of(fleet in force)`
        .start_attempt(assignment) -> StartResult
        .cancel_attempt(assignment_or_ref, reason=, grace_seconds=) -> Decided(cancelled)
        .read_outcome(assignment_or_ref, node_state=, lost_workers=) -> Decided | Wait
        .probe_attempt(assignment_or_ref) -> {worker_id: WorkerProbe}
    AttemptRef.from_assignment(assignment)
    parse_status_object_name(name) -> StatusObjectRef | None   (for gcs-events)
    STATUS_NOTIFICATION_PREFIX                                  (bucket notification filter)

Adapters: HostKeyPinStore / InMemoryPinStore, HostKeySource / GuestAttributeHostKeys (host keys from the
TPU API's guest attributes, never trusted on first use), ObjectStore / GcsObjectStore,
WorkerSettings (production defaults; `.for_emulator(STORAGE_EMULATOR_HOST)` locally).
GCS layout: `tpuq.contracts.gcslayout` (the CLI reads the same). Worker file layout: `tpuq.executor.worker`.
"""

from tpuq.executor.executor import AttemptRef, Executor, StartResult, WorkerProbe
from tpuq.contracts.gcslayout import STATUS_NOTIFICATION_PREFIX, StatusObjectRef, parse_status_object_name
from tpuq.executor.objects import GcsObjectStore, ObjectStore, StoredObject
from tpuq.executor.outcome import Decided, Decision, NodeState, Wait, WorkerStatus, decide_outcome
from tpuq.executor.pins import HostKeyPinStore, InMemoryPinStore
from tpuq.executor.ssh import ConnectPolicy, HostKeyMismatch, SshLogin, WorkerPool, run_on_workers
from tpuq.executor.workerspec import AttemptPlan, WorkerSettings, build_worker_env

__all__ = [
    "STATUS_NOTIFICATION_PREFIX",
    "AttemptPlan",
    "AttemptRef",
    "ConnectPolicy",
    "Decided",
    "Decision",
    "Executor",
    "GcsObjectStore",
    "HostKeyMismatch",
    "HostKeyPinStore",
    "InMemoryPinStore",
    "NodeState",
    "ObjectStore",
    "SshLogin",
    "StartResult",
    "StatusObjectRef",
    "StoredObject",
    "Wait",
    "WorkerPool",
    "WorkerProbe",
    "WorkerSettings",
    "WorkerStatus",
    "build_worker_env",
    "decide_outcome",
    "parse_status_object_name",
    "run_on_workers",
]
