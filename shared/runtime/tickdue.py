"""When each service's tick next has work, and the routing of the minute's tick to those that have (issue 34 §1:
an idle deployment reads almost nothing).

Every service's tick work is decided by one document it keeps in `tick_due/` (the scheduler's backstops and due
passes, `tick_due/scheduler`; the executor's deferred judgements and sweep, `tick_due/executor`; each fleet's
claimer mark, `tick_due/claimer:{fleet}`), and every write of such a document also writes `due_at`, the first
instant at which a tick of that service has something to do (`ALWAYS`: every tick, while it watches something
live). So nothing else is needed to know whether a service's tick is worth sending: Cloud Scheduler's tick goes to
the janitor alone, which runs one query, `tick_due where due_at <= now` (billed one read when nothing is due,
https://cloud.google.com/firestore/pricing), and publishes the tick to the topic of each service with a document
due (`topology.tick_topic`). A nudge (a person's change) goes to every service; so does the first tick a janitor
instance routes, for a document not written yet (a new deployment, a fleet never ticked).

The service's own handling is as before: it reads its document and does what is due, so a tick routed late or
twice does nothing wrong, and a document whose write was lost leaves `due_at` at a past instant (routed again, the
next minute) or at the backstop cadence at the latest (every due includes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from typing import Callable

from tpuq.contracts import store
from tpuq.contracts.documents import TpuDoc, TpuState

DUE_AT = "due_at"
# A due that every tick meets: the service watches something live (the claimer a request or queued resource, the
# executor probing its workers).
ALWAYS = datetime(1970, 1, 1, tzinfo=timezone.utc)

SCHEDULER = "scheduler"
EXECUTOR = "executor"
CLAIMER = "claimer"
JANITOR = "janitor"  # the router: its own document says when its own tick work is due
ROUTED = (SCHEDULER, CLAIMER, EXECUTOR)  # the services whose ticks are routed; the janitor gets the clock's own
# A TPU written in one of these states gives the janitor work (the idle rule; a delete to finish): every commit that
# writes one also writes the janitor's `due_at` to ALWAYS (`tpuq.runtime.guarded.commit_guarded`), whoever writes
# it, so no writer can forget to.
WAKE_JANITOR_STATES = frozenset({TpuState.idle, TpuState.deleting})


def claimer_doc_id(fleet: str) -> str:
    return f"{CLAIMER}:{fleet}"


def service_of(doc_id: str) -> str | None:
    """The service a `tick_due/` document belongs to (None: not one of them)."""
    service = doc_id.split(":", 1)[0]
    return service if service in ROUTED else None


def earliest(*dues: datetime | None) -> datetime | None:
    return min((d for d in dues if d is not None), default=None)


def of_turn(at: datetime | None) -> datetime:
    """A run's next turn as a `due_at` (None, as `tpuq.runtime.cadence.due_at` says for a run due now: ALWAYS)."""
    return ALWAYS if at is None else at


def wakes_janitor(path: str, fields: dict) -> bool:
    """Whether a write of `fields` to the document at `path` gives the janitor's tick work."""
    collection, _, rest = path.partition("/")
    return collection == store.TPUS and "/" not in rest and fields.get(TpuDoc.field("state")) in WAKE_JANITOR_STATES


def services_due(doc_ids: list[str]) -> list[str]:
    """The services to tick, given the ids of the documents the router's query found due."""
    found = {service_of(i) for i in doc_ids}
    return [s for s in ROUTED if s in found]


@dataclass
class RouterMemory:
    """What a routing instance remembers: whether it routed a tick yet (its first goes to every service, for the
    documents not written yet)."""

    routed: bool = False

    def route(self, nudge: bool, due: "Callable[[], dict]") -> tuple[list[str], dict | None]:
        """The services this tick goes to, and the documents found due (None: not asked): every service for a nudge
        or this instance's first tick, else those with a document due (`due`: the router's one query, made only
        then)."""
        first, self.routed = not self.routed, True
        if nudge or first:
            return list(ROUTED), None
        found = due()
        return services_due(list(found)), found


# ------------------------------------------------------------------ shell


def ref(db, doc_id: str):
    return db.collection(store.TICK_DUE).document(doc_id)


def wake_janitor(batch, db) -> None:
    """In `batch`: the janitor's tick has work from now (a TPU made idle or deleting, a pause, a drain asked for)."""
    batch.set(ref(db, JANITOR), {DUE_AT: ALWAYS}, merge=True)


def due_docs(db, now: datetime) -> dict:
    """The `tick_due/` documents due at `now`, by id (one read when none is)."""
    from google.cloud.firestore import FieldFilter

    return {snap.id: snap for snap in db.collection(store.TICK_DUE).where(filter=FieldFilter(DUE_AT, "<=", now)).stream()}
