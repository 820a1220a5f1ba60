"""Firestore layout: collection names and document ids. What the documents hold (their states and typed
views) is `tpuq.contracts.documents`'.

Documents are small and per-entity so that none is hot (the emulator stalls
~2 s per transaction conflict; production allows ~1 write/s per document):

- jobs/{job_id}                      one job: spec, state, budgets, pin            (scheduler)
- jobs/{job_id}/attempts/{n}         one attempt of a job                          (scheduler)
- tpus/{node_id}                     one owned TPU node: idle/busy/deleting/gone   (scheduler, janitor; executor: host_keys)
- requests/{request_id}              one capacity request                          (claimer)
- queued_resources/{qr_id}           one queued resource the claimer created       (claimer)
- zones/{fleet}:{zone}:{type}        back-off / dropped state of one race target   (claimer)
- fleet_status/{fleet}               a project-level block ("billing is disabled") (claimer)
- existing_tpus/{fleet}:{entry}     an `existing:` node's last read: usable or why not (claimer)
- fleets/{name}                      the fleet file in force                       (tpuq fleet apply / dev up / deploy)
- fleet_control/{name}               paused, and a drain asked for and done        (tpuq fleet pause/resume/drain; janitor)
- executions/{job}:{attempt}         the assignment an executor runs, and whether its end was published (executor)
- janitor/{fleet}                    when the last orphan scan ran                 (janitor)
- tick_due/{service}                 when a service's tick next has work; the router reads those due
  tick_due/scheduler                   ... and when each backstop for lost events last ran   (scheduler)
  tick_due/executor                    ... and when ticks judge running attempts again       (executor)
  tick_due/claimer:{fleet}             ... and whether the fleet has nothing to watch        (claimer)
- dead_letters/{id}                  messages that could never be processed        (every service)
- deliveries/{id}                    failed-delivery counters (so nothing loops forever) (every service)
- notifications/{hash}               one event to one destination: sent, tries, next try (janitor)
- notify_destinations/{secret}       a destination's last success and failure        (janitor; tpuq fleet reads)
"""

from __future__ import annotations

import re

JOBS = "jobs"
ATTEMPTS = "attempts"
TPUS = "tpus"
REQUESTS = "requests"
QUEUED_RESOURCES = "queued_resources"
FLEET_STATUS = "fleet_status"
EXISTING_TPUS = "existing_tpus"
EXECUTIONS = "executions"
JANITOR = "janitor"
# tpuq.runtime.tickdue: one document a service (the claimer: a fleet), `due_at` its next tick with work; the janitor's
# tick routes the minute's tick to the services whose document is due (one query).
TICK_DUE = "tick_due"
ZONES = "zones"
FLEETS = "fleets"
FLEET_CONTROL = "fleet_control"
DEAD_LETTERS = "dead_letters"
DELIVERIES = "deliveries"
NOTIFICATIONS = "notifications"
NOTIFY_DESTINATIONS = "notify_destinations"

ALL_COLLECTIONS = (JOBS, TPUS, REQUESTS, QUEUED_RESOURCES, ZONES, FLEET_STATUS, EXISTING_TPUS, FLEETS, FLEET_CONTROL, EXECUTIONS, JANITOR,
                   TICK_DUE, DEAD_LETTERS, DELIVERIES,
                   NOTIFICATIONS, NOTIFY_DESTINATIONS)

_UNSAFE_ID = re.compile(r"[^A-Za-z0-9._:-]")
_RESERVED_ID = re.compile(r"^__.*__$")
ID_MAX_BYTES = 1500


def id_problem(value: str) -> str | None:
    """Why Firestore refuses `value` as a document id, or None. Its rules: valid UTF-8, at most 1,500 bytes, no
    '/', not '.' or '..', not `__.*__`. The client sends a '/' on as a path (`jobs/a/attempts/1` is another
    document) and the server refuses the rest (InvalidArgument): a message naming a document must be checked."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "must be valid UTF-8 text"
    if not value:
        return "must not be empty"
    if "/" in value:
        return "must not contain '/'"
    if value in (".", "..") or _RESERVED_ID.match(value):
        return "must not be '.', '..' or __name__ (reserved by Firestore)"
    if size > ID_MAX_BYTES:
        return f"must be at most {ID_MAX_BYTES} bytes"
    return None


def doc_id(*parts: str) -> str:
    """A Firestore document id from parts; '/' and other separators never leak into it."""
    return ":".join(_UNSAFE_ID.sub("_", p) for p in parts)[:1500]
