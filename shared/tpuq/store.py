"""Firestore layout: collection names and the few shapes every service shares.

Documents are small and per-entity so that none is hot (the emulator stalls
~2 s per transaction conflict; production allows ~1 write/s per document):

- jobs/{job_id}                      one job: spec, state, budgets, pin
- jobs/{job_id}/attempts/{n}         one attempt of a job
- tpus/{node_id}                     one owned TPU node: state, busy/idle, endpoints
- requests/{request_id}              one capacity request and its queued resources
- zones/{fleet}:{zone}:{type}        back-off / dropped state of one race target
- fleets/{name}                      the fleet file in force (+ blocked reason)
- dead_letters/{id}                  messages that could never be processed
- deliveries/{id}                    failed-delivery counters (so nothing loops forever)
"""

from __future__ import annotations

import re

JOBS = "jobs"
ATTEMPTS = "attempts"
TPUS = "tpus"
REQUESTS = "requests"
ZONES = "zones"
FLEETS = "fleets"
DEAD_LETTERS = "dead_letters"
DELIVERIES = "deliveries"

ALL_COLLECTIONS = (JOBS, TPUS, REQUESTS, ZONES, FLEETS, DEAD_LETTERS, DELIVERIES)

_UNSAFE_ID = re.compile(r"[^A-Za-z0-9._:-]")


def doc_id(*parts: str) -> str:
    """A Firestore document id from parts; '/' and other separators never leak into it."""
    return ":".join(_UNSAFE_ID.sub("_", p) for p in parts)[:1500]
