"""The executor service's per-instance state (shell): the Executor it runs attempts with, built on first use.

`tpuq.executor.handlers.build_service` makes one `ExecutorState` per service instance and the handlers read it
from `ctx.state`. The real Executor is built from the `Settings` read once at start and the service's `Clients`:
the SSH key from `settings.ssh_private_key_file` (in production a Secret Manager secret mounted as a file), a
connection cache kept between attempts unless `settings.executor_keep_ssh` is off, the login user from the fleet
in force (`settings.fleet`). Tests and the fleet simulator pass their own executor shell instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import paramiko

from tpuq.contracts import gcslayout, store
from tpuq.contracts.documents import TpuDoc, short_node_name
from tpuq.executor import budget
from tpuq.executor.executor import Executor
from tpuq.executor.objects import GcsObjectStore
from tpuq.executor.pins import GuestAttributeHostKeys
from tpuq.executor.ssh import ConnectionCache, SshLogin
from tpuq.executor.workerspec import WorkerSettings
from tpuq.runtime.clients import Clients
from tpuq.runtime.fleetstore import load_fleet
from tpuq.runtime.settings import ENV_SSH_PRIVATE_KEY_FILE, Settings


class ExecutorState:
    """What one executor instance keeps between messages: its Executor (built by `build` on first use, once, and
    with it the SSH connections it keeps) and how often a running attempt's workers are probed (None: never, the
    simulator's modelled workers, which are never lost without their node)."""

    def __init__(self, build: Callable[[], Executor], probe_every: timedelta | None):
        self._build = build
        self._executor: Executor | None = None
        self._lock = threading.Lock()
        self.probe_every = probe_every
        # executions/{job}:{attempt} id -> when this instance last probed its workers. Kept here, not written at
        # each probe: the record is written only when a probe changes it (`decide.probe_record`).
        self._probed_at: dict[str, datetime] = {}
        # How a copy of an assignment that found its attempt leased waits for the start underway (tests pass a
        # fake sleep) and how often a starting delivery renews its lease (tpuq.executor.budget).
        self.sleep: Callable[[float], None] = time.sleep
        self.underway_wait_seconds = budget.UNDERWAY_WAIT_SECONDS
        self.lease_renew_seconds = budget.LEASE_RENEW_SECONDS

    @classmethod
    def of(cls, executor, probe_every: timedelta | None) -> "ExecutorState":
        """A state serving with this executor shell, already built."""
        state = cls(lambda: executor, probe_every)
        state._executor = executor
        return state

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            with self._lock:  # concurrent requests of one instance build one Executor (one connection cache)
                if self._executor is None:
                    self._executor = self._build()
        return self._executor

    def probed_at(self, execution_id: str) -> datetime | None:
        """When this instance last probed the attempt's workers (None: not since it started)."""
        return self._probed_at.get(execution_id)

    def record_probe(self, execution_id: str, at: datetime) -> None:
        self._probed_at[execution_id] = at

    def keep_probes_of(self, running: set[str]) -> None:
        """Forget the probes of attempts no longer running (the tick's query did not return them), so the memory
        holds one entry per running attempt, never history."""
        with self._lock:
            for gone in set(self._probed_at) - running:
                self._probed_at.pop(gone, None)

    @property
    def built(self) -> Executor | None:
        """The Executor if this instance built one yet (None: it never connected anywhere)."""
        return self._executor


class FirestorePinStore:
    """Host-key pins in `tpus/{node}.host_keys`, first writer wins (a transaction per node)."""

    def __init__(self, db):
        self.db = db

    def _ref(self, node: str):
        return self.db.collection(store.TPUS).document(short_node_name(node))

    def get_pins(self, node: str):
        snap = self._ref(node).get()
        if not snap.exists:
            return {}
        return {int(k): v for k, v in ((snap.to_dict() or {}).get(TpuDoc.field("host_keys")) or {}).items()}

    def add_pins(self, node: str, pins):
        from google.cloud import firestore

        ref = self._ref(node)

        @firestore.transactional
        def merge(tx):
            snap = ref.get(transaction=tx)
            current = {int(k): v for k, v in ((snap.to_dict() or {}).get(TpuDoc.field("host_keys")) or {}).items()}
            for worker, key in pins.items():
                current.setdefault(int(worker), key)
            tx.set(ref, TpuDoc.fields(host_keys={str(k): v for k, v in current.items()}), merge=True)
            return current

        return merge(self.db.transaction())

    def forget(self, node: str) -> None:
        from google.cloud import firestore

        self._ref(node).set(TpuDoc.fields(host_keys=firestore.DELETE_FIELD), merge=True)


def load_private_key(settings: Settings) -> paramiko.PKey:
    """The executor's SSH key: a file locally (tpuq dev up makes one); in production mounted from Secret Manager."""
    if not settings.ssh_private_key_file:
        raise RuntimeError(f"{ENV_SSH_PRIVATE_KEY_FILE} is not set (mount the Secret Manager secret as a file)")
    return paramiko.Ed25519Key.from_private_key_file(settings.ssh_private_key_file)


def build_executor(settings: Settings, clients: Clients) -> Executor:
    """The production Executor. Kept connections (`settings.executor_keep_ssh`, TPUQ_EXECUTOR_KEEP_SSH=0 opens a
    new SSH connection per call) pay off only while the instance lives and its CPU runs between requests: on Cloud
    Run, min instances >= 1 and CPU always allocated (see docs/DEPLOYING.md, "Keeping the executor's SSH
    connections between jobs")."""
    emulator = settings.storage_emulator
    status_bucket = gcslayout.bucket_name(settings.runner_bucket) if settings.runner_bucket else None
    worker_settings = (WorkerSettings.for_emulator(emulator, status_bucket=status_bucket) if emulator
                       else WorkerSettings(status_bucket=status_bucket))
    key = load_private_key(settings)
    return Executor(
        # One source for the login user: the fleet in force, whose ssh_user the claimer wrote into each node's
        # ssh-keys metadata (the only user the guest agent creates). Read per pool, as the transport.
        ssh_login=lambda: SshLogin.of(load_fleet(clients.firestore, settings.fleet)),
        ssh_key=lambda: key,
        pin_store=FirestorePinStore(clients.firestore),
        # Host keys come from the nodes' guest attributes (roles/tpu.viewer), never from a first connection.
        host_keys=GuestAttributeHostKeys(clients.tpu),
        objects=GcsObjectStore(clients.storage),
        clock=lambda: datetime.now(timezone.utc),
        settings=worker_settings,
        failure_grace=settings.executor_failure_grace,
        connection_cache=ConnectionCache() if settings.executor_keep_ssh else None,
    )
