"""Chaos soak (issue 17 §3): many jobs on the local stack while every fault below is injected at random, seeded.

    python benchmarks/chaos.py [--seed 1] [--jobs 500] [--minutes 10]

The stack is the real one (emulators, fake GCS, the fake Cloud TPU with sshd workers, the four services behind
the push front), and for the whole window:

- Pub/Sub: the front delivers every push twice, the second copy up to 2 s later (out of order);
- Cloud TPU API: 5% of calls answer 503 UNAVAILABLE, 2% hang and answer 504 (half of them after doing the
  work), 5% wait up to 5 s first (the fake's fault layer, `FakeTpuControl.set_chaos`);
- spot preemptions of attempts that are starting (job assigned), running, and ending (a worker's status
  object written, the job not yet ended);
- `kill -9` of each service at random moments, each started again 2-5 s later; the executor also killed while
  it starts an attempt on the 4-host slice;
- one worker host (its sshd and every process of it) killed outright while its job runs.

Then the invariants, as figures (0 is the goal for each):

- `jobs`: every published job exists, is terminal, once: its attempts, replayed through `tpuq.contracts.jobstate`'s
  table, lead to its state, and only the last attempt ended the job;
- `overlap`: no two attempts of one job ran at the same time, judged from the stamps the job's own command
  printed on the workers (read back from the attempts' logs in GCS);
- `leftovers`: no queued resource or node of tpuq's is left once the fleet's idle timeout has passed;
- `foreign_deletes`: nothing tpuq did not create was deleted (two hand-made queued resources, one with a
  node, made at the start; the fake's call log must show no DELETE of them, and they must still exist);
- `looped`: Pub/Sub pushed no message more than `MAX_DELIVERIES` times (the front counts per message id);
- `liveness`: at every sample (every `SAMPLE_SECONDS`, from the first publish to the end), every pending job keeps
  `tpuq.contracts.liveness`'s rule: within its bound after it could run, it is assigned, or the claimer holds its capacity
  request open, or it shows a reason that holds it.

Output: one JSON line (jobs, outcomes, faults by kind, violations by invariant); details on stderr.
`run()` is what tests/e2e/test_chaos.py calls with fewer jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests
import yaml

from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.contracts.documents import AttemptDoc, AttemptState, JobDoc, JobState, RequestStatus, execution_doc_id
from tpuq.contracts.jobstate import IllegalTransition, JobEvent, transition
from tpuq.contracts.liveness import nothing_holds
from tpuq.contracts.messages import AttemptOutcome
from tpuq.operations.queries import worker_log_chunks, worker_statuses
from tpuq_dev.devstack.stack import DevStack
from tpuq_dev.faketpu.control import FakeTpuControl, FakeTpuControlError

PROJECT = "tpuq-local"
ZONES = ("us-central2-a", "us-central2-b")
SERVICES = ("scheduler", "claimer", "executor", "janitor")
SINGLE, POD = "v4-8", "v4-32"  # one host; four hosts
IDLE_TIMEOUT = 15  # seconds: the fleet's, short, so that leftovers can be judged soon after the last job
MAX_DELIVERIES = 30  # pushes of one message: more is a loop (redeliveries while a service is down stay far below)
STAMP = "CHAOS_STAMP="
HAND_MADE = ("hand-made-1", "hand-made-2")  # queued resources (and nodes) tpuq did not create, in ZONES[0]
INVARIANTS = ("jobs", "overlap", "leftovers", "foreign_deletes", "looped", "liveness")
SAMPLE_SECONDS = 5.0  # how often the liveness rule is checked over every pending job

SCENARIO = {
    "seed": 1,
    "zones": {z: {"quota": {"v4": {"spot": 512}}} for z in ZONES},
    "delays": {"accepted": 1, "waiting": 5, "provisioning": 60, "suspending": 10, "deleting": 5, "host_keys": 30},
}
TIME_SCALE = 60.0


def fleet(name: str = "chaos") -> dict:
    return {
        "name": name, "project": PROJECT, "owner_prefix": "tpuq", "idle_timeout_seconds": IDLE_TIMEOUT,
        # Budgets big enough that faults alone never fail a job: each job should succeed in the end.
        "retry": {"preemptions": 50, "infra_failures": 50, "backoff_base_seconds": 0.5, "backoff_max_seconds": 2},
        "claim": {"valid_until_seconds": 3600, "watch_interval_seconds": 1, "capacity_backoff_base_seconds": 5},
        "tpus": [
            {"id": "single", "type": SINGLE, "zones": list(ZONES), "count": 3},
            {"id": "pod", "type": POD, "zones": list(ZONES), "count": 1},
        ],
    }


def job_command(beats: int) -> str:
    """Stamps the time when it starts, every half second, and when it ends: the attempt's own witness."""
    stamp = f'echo "{STAMP}$(date +%s.%N)"'
    return f"{stamp}; for i in $(seq {beats}); do sleep 0.5; {stamp}; done"


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- invariants (pure)


_OUTCOME_EVENT = {
    AttemptOutcome.succeeded.value: JobEvent.succeed,
    AttemptOutcome.failed.value: JobEvent.fail,
    AttemptOutcome.failed_setup.value: JobEvent.fail,
    AttemptOutcome.cancelled.value: JobEvent.cancel,
}
_TERMINAL_EVENT = {JobState.succeeded: JobEvent.succeed, JobState.failed: JobEvent.fail,
                   JobState.cancelled: JobEvent.cancel}


def job_history_problems(job: dict | None, attempts: list[dict]) -> list[str]:
    """What is wrong with one job's end and its attempt history (empty: nothing). `attempts` as stored."""
    if job is None:
        return ["missing"]
    state = JobState(job.get("state"))
    if not state.terminal:
        return [f"not terminal: {state.value}"]
    docs = sorted((AttemptDoc.from_doc(a) for a in attempts), key=lambda a: a.attempt)
    numbers = [a.attempt for a in docs]
    problems = []
    if numbers != list(range(1, len(docs) + 1)):
        problems.append(f"attempt numbers {numbers}")
    if int(job.get("attempts") or 0) != len(docs):
        problems.append(f"attempts field {job.get('attempts')} but {len(docs)} attempt documents")
    current = JobState.pending
    try:
        for i, a in enumerate(docs):
            last = i == len(docs) - 1
            current = transition(current, JobEvent.assign)
            if a.started_at is not None:
                current = transition(current, JobEvent.start)
            if a.state != AttemptState.ended:
                problems.append(f"attempt {a.attempt} never ended ({a.state.value})")
                break
            terminal_event = _OUTCOME_EVENT.get(a.outcome or "")
            if not last:
                if terminal_event is not None:
                    problems.append(f"attempt {a.attempt} ended the job ({a.outcome}) but attempt {a.attempt + 1} "
                                    f"followed")
                    break
                event = JobEvent.requeue if a.outcome else JobEvent.unassign
                current = transition(current, event if current != JobState.running else JobEvent.requeue)
            else:
                current = transition(current, terminal_event or _TERMINAL_EVENT.get(state, JobEvent.fail))
        if not docs:
            current = transition(current, JobEvent.cancel if state == JobState.cancelled else JobEvent.reject)
    except IllegalTransition as e:
        problems.append(f"history refused by the transition table: {e}")
    else:
        if not problems and current != state:
            problems.append(f"history leads to {current.value}, job says {state.value}")
    return problems


def overlaps(stamps_by_attempt: dict[int, list[float]]) -> list[str]:
    """Attempts of one job whose stamped intervals [first, last] intersect."""
    spans = sorted((min(s), max(s), n) for n, s in stamps_by_attempt.items() if s)
    out = []
    for (s1, e1, n1), (s2, e2, n2) in zip(spans, spans[1:]):
        if s2 <= e1:
            out.append(f"attempts {n1} [{s1:.2f}, {e1:.2f}] and {n2} [{s2:.2f}, {e2:.2f}] overlap")
    return out


def stamps_of(text: str) -> list[float]:
    out = []
    for line in text.splitlines():
        if line.startswith(STAMP):
            try:
                out.append(float(line[len(STAMP):].strip()))
            except ValueError:
                pass
    return out


# ----------------------------------------------------------------------------------------------------- the run


@dataclass
class Soak:
    seed: int
    n_jobs: int
    minutes: float
    work: Path
    stack: DevStack | None = None
    clients: Clients | None = None
    control: FakeTpuControl | None = None
    faults: Counter = field(default_factory=Counter)
    published: dict[str, str] = field(default_factory=dict)  # job id -> TPU type
    touched: set[str] = field(default_factory=set)  # jobs a preemption or host kill hit already
    unheld: dict[str, str] = field(default_factory=dict)  # job id -> the first sample that found nothing holding it
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def window(self) -> float:
        return self.minutes * 60.0

    # -------------------------------------------------------------------------------------------- the stack
    def start(self) -> None:
        (self.work / "scenario.yaml").write_text(yaml.safe_dump(SCENARIO))
        (self.work / "fleet.yaml").write_text(yaml.safe_dump(fleet()))
        self.stack = DevStack(
            state_dir=self.work / "dev", services=SERVICES, scenario=self.work / "scenario.yaml",
            fleet_file=self.work / "fleet.yaml", time_scale=TIME_SCALE, tick_period=1.0,
            push_copies=2, push_copy_delay_seconds=2.0, push_seed=self.seed,
            # A lost assignment is sent again after 30 s, not 5 minutes: the soak's kills lose some. And the
            # scheduler looks for lost events every 10 s, not 5 minutes (its ticks come every second).
            service_env={"TPUQ_EXECUTOR_PROBE_SECONDS": "2", "TPUQ_REPUBLISH_ASSIGNMENT_SECONDS": "30",
                         "TPUQ_BACKSTOP_SECONDS": "10"},
        )
        env = self.stack.up()
        os.environ.update(env)
        self.clients = Clients(Settings.from_env(env))
        self.control = FakeTpuControl(env["TPUQ_TPU_API_ENDPOINT"])

    def tpu_api(self, method: str, path: str, **kwargs) -> requests.Response:
        """A call to the fake's REST API as a person's script would make it, retried through the chaos."""
        url = f"{self.stack.env['TPUQ_TPU_API_ENDPOINT']}/v2/projects/{PROJECT}/locations/{path}"
        deadline = time.monotonic() + 300
        while True:
            try:
                r = requests.request(method, url, timeout=60, **kwargs)
                if r.status_code < 500:
                    return r
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{method} {path}: the fake does not answer")
            time.sleep(0.5)

    def make_hand_made(self) -> None:
        """Two queued resources a person made by hand (no tpuq labels; one labelled by another tool)."""
        for qr_id, labels in zip(HAND_MADE, ({}, {"owner": "someone-else", "managed-by": "terraform"})):
            body = {"tpu": {"nodeSpec": [{"parent": f"projects/{PROJECT}/locations/{ZONES[0]}", "nodeId": qr_id,
                                          "node": {"acceleratorType": SINGLE, "runtimeVersion": "tpu-ubuntu2204-base",
                                                   "schedulingConfig": {"spot": True}, "labels": labels}}]},
                    "spot": {}}
            r = self.tpu_api("POST", f"{ZONES[0]}/queuedResources", params={"queuedResourceId": qr_id}, json=body)
            if r.status_code >= 300 and r.status_code != 409:
                raise RuntimeError(f"hand-made {qr_id}: {r.status_code} {r.text}")

    def hand_made_left(self) -> list[str]:
        return [q for q in HAND_MADE if self.tpu_api("GET", f"{ZONES[0]}/queuedResources/{q}").status_code == 200]

    def tpuq_resources(self) -> list[str]:
        """Queued resources and nodes in the project other than the hand-made ones."""
        names = []
        for kind in ("queuedResources", "nodes"):
            r = self.tpu_api("GET", f"-/{kind}", params={"pageSize": 1000})
            for item in r.json().get(kind, []):
                if item["name"].rsplit("/", 1)[-1] not in HAND_MADE:
                    names.append(f"{item['name']} ({(item.get('state') or {}).get('state') if kind == 'queuedResources' else item.get('state')})")
        return names

    # ------------------------------------------------------------------------------------------ the workload
    def publish_all(self, rng: random.Random) -> None:
        """Every job, at random moments over the first half of the window."""
        t0 = time.monotonic()
        moments = sorted(rng.uniform(0, self.window * 0.5) for _ in range(self.n_jobs))
        for i, at in enumerate(moments):
            if self.stop.is_set():
                return
            delay = t0 + at - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)
            tpu = POD if rng.random() < 0.15 else SINGLE
            job_id = f"chaos-{self.seed}-{i:04d}"
            body = {"id": job_id, "tpu": tpu, "command": job_command(rng.randint(2, 5))}
            for _ in range(20):
                try:
                    self.clients.publish("jobs", body)
                    break
                except Exception as e:  # noqa: BLE001 - the emulator under load: publish again
                    log("publish failed, again:", e)
                    time.sleep(1)
            self.published[job_id] = tpu

    def active_jobs(self) -> list[dict]:
        from google.cloud.firestore_v1.base_query import FieldFilter

        q = self.clients.firestore.collection(store.JOBS).where(
            filter=FieldFilter("state", "in", [JobState.assigned.value, JobState.running.value]))
        return [d.to_dict() for d in q.stream()]

    def job(self, job_id: str) -> dict | None:
        snap = self.clients.firestore.collection(store.JOBS).document(job_id).get()
        return snap.to_dict() if snap.exists else None

    # ---------------------------------------------------------------------------------------------- faults
    def due(self, kind: str, target: int, elapsed: float) -> bool:
        """Spread `target` injections of `kind` over the first 80% of the window."""
        return self.faults[kind] < min(target, 1 + int(target * elapsed / (self.window * 0.8)))

    def processes_loop(self, rng: random.Random) -> None:
        """kill -9 of each service at random moments, each back 2-5 s later; the executor also killed while it
        starts an attempt on the 4-host slice. Every process operation happens in this one thread."""
        kills_each = max(1, round(self.minutes / 4))
        plan = sorted((rng.uniform(0.05, 0.8) * self.window, name) for name in SERVICES for _ in range(kills_each))
        restarts: list[tuple[float, str]] = []
        t0 = time.monotonic()
        mid_start_target = max(1, round(self.minutes / 5))
        while not self.stop.is_set():
            now = time.monotonic() - t0
            for at, name in [r for r in restarts if r[0] <= now]:
                restarts.remove((at, name))
                try:
                    began = time.monotonic()
                    self.stack.start_service_again(name)
                    log("started", name, "again in", round(time.monotonic() - began, 1), "s")
                except Exception as e:  # noqa: BLE001 - say so; the run goes on
                    self.errors.append(f"restart {name}: {e}")
            down = {name for _, name in restarts}
            while plan and plan[0][0] <= now:
                _, name = plan.pop(0)
                if name in down:  # still down from another kill: its own kill comes a little later
                    plan = sorted([*plan, (now + 5.0, name)])
                    continue
                self.stack.kill_service(name)
                self.faults[f"kill_{name}"] += 1
                restarts.append((now + rng.uniform(2, 5), name))
                down.add(name)
                log("killed", name)
            if "executor" not in down and self.faults["kill_executor_mid_start"] < mid_start_target and \
                    now > self.window * 0.1:
                if self.kill_executor_mid_start():
                    restarts.append((now + rng.uniform(2, 5), "executor"))
            self.stop.wait(0.1)
        for _, name in restarts:
            self.stack.start_service_again(name)

    def kill_executor_mid_start(self) -> bool:
        try:
            starting = [j for j in self.active_jobs() if j.get("state") == JobState.assigned.value and j.get("tpu")
                        and self.published.get(j.get("id")) == POD]
        except Exception:  # noqa: BLE001 - Firestore busy: next time
            return False
        if not starting:
            return False
        self.stack.kill_service("executor")
        self.faults["kill_executor_mid_start"] += 1
        log("killed the executor while it starts", starting[0]["id"], "on", starting[0]["tpu"])
        return True

    def tpu_faults_loop(self, rng: random.Random) -> None:
        """Preemptions of starting, running and ending attempts; one worker host killed while its job runs."""
        target = max(2, self.n_jobs // 40)
        t0 = time.monotonic()
        while not self.stop.is_set():
            elapsed = time.monotonic() - t0
            try:
                jobs = self.active_jobs()
            except Exception:  # noqa: BLE001 - Firestore busy: next time
                jobs = []
            rng.shuffle(jobs)
            for j in jobs:
                jid, node = j.get("id"), j.get("tpu")
                if not node or jid in self.touched:
                    continue
                if j.get("state") == JobState.assigned.value and self.due("preempt_starting", target, elapsed):
                    self.preempt(j, "preempt_starting")
                elif j.get("state") == JobState.running.value:
                    if self.faults["kill_worker_host"] < 1 and elapsed > self.window * 0.2:
                        self.kill_host(j)
                    elif self.due("preempt_ending", target, elapsed) and self.ending(j):
                        self.preempt(j, "preempt_ending")
                    elif self.due("preempt_running", target, elapsed) and rng.random() < 0.3:
                        self.preempt(j, "preempt_running")
            self.stop.wait(0.2)

    def ending(self, j: dict) -> bool:
        """A worker wrote its final status object, and the job has not ended yet."""
        try:
            return any(s.get("exit_code") is not None for s in worker_statuses(self.clients.storage, j).values())
        except Exception:  # noqa: BLE001
            return False

    def preempt(self, j: dict, kind: str) -> None:
        try:
            self.control.preempt(j["tpu"])
        except FakeTpuControlError:
            return  # not READY (yet, or any more): no preemption happened
        self.touched.add(j["id"])
        self.faults[kind] += 1
        log(kind, j["id"], j["tpu"])

    def kill_host(self, j: dict) -> None:
        try:
            hosts = self.control.node_info(j["tpu"])["hosts"]
        except FakeTpuControlError:
            return
        if not hosts or not hosts[-1].get("init_pid"):
            return
        try:
            os.kill(int(hosts[-1]["init_pid"]), signal.SIGKILL)  # the namespace's init: every process of the host
        except ProcessLookupError:
            return
        self.touched.add(j["id"])
        self.faults["kill_worker_host"] += 1
        log("killed worker", hosts[-1]["worker"], "of", j["tpu"], "running", j["id"])

    # ------------------------------------------------------------------------------------------- the checks
    def liveness_loop(self, rng: random.Random) -> None:
        """The liveness rule over every pending job, every SAMPLE_SECONDS until the soak stops."""
        while not self.stop.wait(SAMPLE_SECONDS):
            self.sample_liveness()

    def sample_liveness(self) -> None:
        from google.cloud.firestore_v1.base_query import FieldFilter

        db = self.clients.firestore
        pending = db.collection(store.JOBS).where(filter=FieldFilter("state", "==", JobState.pending.value)).stream()
        jobs = [JobDoc.from_doc(s.to_dict() or {}, s.id) for s in pending]
        if not jobs:
            return
        # The claimer's open requests, read after the jobs: a request recorded after the job was read is counted.
        open_ids = {s.id for s in db.collection(store.REQUESTS)
                    .where(filter=FieldFilter("status", "==", RequestStatus.open.value)).stream()}
        now = datetime.now(timezone.utc)
        for job in jobs:
            reason = nothing_holds(job, open_ids, now)
            if reason and job.id in self.published and job.id not in self.unheld:
                self.unheld[job.id] = f"{job.id} at {now:%H:%M:%S}: {reason}"
                log("LIVENESS", self.unheld[job.id])
                self.dump(job.id)

    def wait_terminal(self, deadline: float) -> None:
        last_dump = last_log = time.monotonic()
        last_states: Counter = Counter()
        while time.monotonic() < deadline:
            states, waiting = Counter(), []
            for snap in self.clients.firestore.collection(store.JOBS).select(["state"]).stream():
                if snap.id in self.published:
                    state = (snap.to_dict() or {}).get("state")
                    states[state] += 1
                    if not (state and JobState(state).terminal):
                        waiting.append(snap.id)
            done = sum(n for s, n in states.items() if s and JobState(s).terminal)
            if done == len(self.published) == self.n_jobs:
                return
            if states != last_states or time.monotonic() - last_log >= 5:
                last_states, last_log = states, time.monotonic()
                log(f"{done}/{self.n_jobs} jobs terminal", dict(states))
            if time.monotonic() - last_dump > 60 and len(waiting) <= 5:
                last_dump = time.monotonic()
                for job_id in waiting:  # what a stall looks like, for whoever reads the log
                    self.dump(job_id)
            time.sleep(1)  # one query: the soak ends within a second of its last job, not up to 5 s later

    def dump(self, job_id: str) -> None:
        job = self.job(job_id) or {}
        log("STALLED", job_id, {k: str(job.get(k)) for k in ("state", "attempt", "tpu", "assigned_at", "started_at",
                                                              "assignment_republished_at", "not_before", "blocked",
                                                              "capacity_request", "capacity_requests",
                                                              "pinned_region", "reason", "updated_at")})
        request = (job.get("capacity_request") or {}).get("id")
        if request:
            record = self.clients.firestore.collection(store.REQUESTS).document(request).get().to_dict()
            log("  request", request, "at the claimer:", (record or {}).get("status", "no record"))
        if job.get("attempt"):
            snap = self.clients.firestore.collection(store.EXECUTIONS).document(
                execution_doc_id(job_id, int(job["attempt"]))).get()
            log("  execution", {k: str(v)[:200] for k, v in (snap.to_dict() or {}).items() if k != "assignment"})

    def check(self, max_wait_leftovers: float) -> tuple[dict[str, list[str]], Counter, int]:
        violations: dict[str, list[str]] = {k: [] for k in INVARIANTS}
        outcomes: Counter = Counter()
        attempts_total = 0
        for job_id in sorted(self.published):
            job = self.job(job_id)
            attempt_docs = [] if job is None else [
                {**(d.to_dict() or {}), "attempt": int(d.id)} for d in
                self.clients.firestore.collection(store.JOBS).document(job_id).collection(store.ATTEMPTS).stream()]
            for p in job_history_problems(job, attempt_docs):
                violations["jobs"].append(f"{job_id}: {p}")
            if job is None:
                continue
            outcomes[job.get("state")] += 1
            attempts_total += len(attempt_docs)
            stamps = {}
            for a in attempt_docs:
                by_worker: dict[int, str] = {}
                for c in worker_log_chunks(self.clients.storage, job, a["attempt"]):
                    by_worker[c.worker] = by_worker.get(c.worker, "") + c.text
                stamps[a["attempt"]] = [t for text in by_worker.values() for t in stamps_of(text)]
            for p in overlaps(stamps):
                violations["overlap"].append(f"{job_id}: {p}")
        # Leftovers: once the idle timeout has passed, nothing of tpuq's may be left in the project.
        deadline = time.monotonic() + max_wait_leftovers
        while True:
            left = self.tpuq_resources()
            if not left or time.monotonic() > deadline:
                break
            time.sleep(1)
        violations["leftovers"] = left
        deletes = [c for c in self.control.calls(method="DELETE")
                   if c["path"].rsplit("/", 1)[-1].split("?")[0] in HAND_MADE]
        violations["foreign_deletes"] = [f"{c['method']} {c['path']} -> {c.get('status')}" for c in deletes]
        violations["foreign_deletes"] += [f"{q} is gone" for q in HAND_MADE if q not in self.hand_made_left()]
        counts = self.stack.delivery_counts()
        violations["looped"] = [f"{sub} {mid}: {n} pushes" for (sub, mid), n in counts.items() if n > MAX_DELIVERIES]
        self.max_deliveries = max(counts.values(), default=0)
        self.sample_liveness()
        violations["liveness"] = list(self.unheld.values())
        return violations, outcomes, attempts_total


def run(seed: int = 1, jobs: int = 500, minutes: float = 10.0, work: Path | None = None) -> dict:
    started = time.monotonic()
    work = work or Path(tempfile.mkdtemp(prefix="tpuq-chaos-"))
    soak = Soak(seed, jobs, minutes, work)
    rng = random.Random(seed)
    threads: list[threading.Thread] = []
    try:
        soak.start()
        soak.make_hand_made()
        log("stack up in", round(time.monotonic() - started, 1), "s; state in", work)
        soak.control.set_chaos(seed, unavailable=0.05, timeout=0.02, hang_seconds=10.0, spike=0.05,
                               spike_max_seconds=5.0)
        loops: list[tuple[Callable, random.Random]] = [
            (soak.publish_all, random.Random(rng.getrandbits(64))),
            (soak.processes_loop, random.Random(rng.getrandbits(64))),
            (soak.tpu_faults_loop, random.Random(rng.getrandbits(64))),
            (soak.liveness_loop, random.Random(0)),
        ]

        def guarded(fn, r):
            try:
                fn(r)
            except Exception as e:  # noqa: BLE001 - a broken injector is reported, not hidden
                soak.errors.append(f"{fn.__name__}: {e!r}")
                log("injector failed:", fn.__name__, repr(e))

        threads = [threading.Thread(target=guarded, args=loop, daemon=True) for loop in loops]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        threads[0].join()  # every job published
        soak.stop.wait(max(0.0, soak.window - (time.monotonic() - t0)))
        # Faults go on until the window ends (or longer, while jobs remain); terminal states come through retries.
        soak.wait_terminal(time.monotonic() + max(600.0, soak.window))
        soak.stop.set()
        for t in threads[1:]:
            t.join(timeout=120)
        injected = soak.control.chaos()["injected"]
        soak.faults.update({f"tpu_api_{k}": v for k, v in injected.items()})
        soak.faults["pubsub_pushes_duplicated"] = sum(soak.stack.delivery_counts().values())
        soak.control.set_chaos(0)  # the check's own reads need no weather; the janitor still deletes through it
        violations, outcomes, attempts = soak.check(max_wait_leftovers=IDLE_TIMEOUT + 240.0)
    finally:
        soak.stop.set()
        if soak.stack is not None:
            soak.stack.down()
    for name, items in violations.items():
        for item in items[:20]:
            log("VIOLATION", name, item)
    for e in soak.errors:
        log("ERROR", e)
    load = os.getloadavg()
    return {
        "bench": "chaos", "seed": seed, "jobs": jobs, "minutes": minutes, "published": len(soak.published),
        "outcomes": dict(outcomes), "attempts": attempts,
        # Jobs still queued or on a TPU when the soak stopped waiting: part of the `jobs` figure, and while they
        # hold TPUs, of `leftovers` too. A machine too loaded to finish the jobs in time shows here.
        "unfinished": sum(n for state, n in outcomes.items() if not JobState(state).terminal), "faults": dict(sorted(soak.faults.items())),
        "violations": {k: len(v) for k, v in violations.items()}, "max_deliveries_per_message": soak.max_deliveries,
        "injector_errors": len(soak.errors), "wall_s": round(time.monotonic() - started, 1),
        "load_avg": [round(x, 1) for x in load],
        "examples": {k: v[:3] for k, v in violations.items() if v},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args(argv)
    result = run(args.seed, args.jobs, args.minutes)
    print(json.dumps(result), flush=True)
    return 0 if not any(result["violations"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
