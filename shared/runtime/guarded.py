"""Guarded writes: the one way two services' racing writes to a document get exactly one winner.

A write set is committed as one atomic batch in which every document read
carries a precondition: "unchanged since I read it" (its update time) or
"still absent". Either every write lands or none does, and a concurrent writer
makes the commit fail at once with FailedPrecondition (AlreadyExists for a
document that appeared) instead of holding a read lock.

That is what a Firestore transaction guarantees for these few documents,
without its cost here: the emulator locks on read and every conflict stalls
~2 s, and two scheduler instances running the same deterministic plan would
conflict on every pair they both try to assign.

Who uses it, over which document:
- the scheduler's assignment (job pending -> assigned, TPU idle -> busy), its
  frees and node-lost writes, its request bookkeeping;
- the janitor's `deleting` mark on `tpus/{node}` before it deletes a TPU, and
  its orphan-scan election on `janitor/{fleet}`;
- the claimer's claim of a (zone, type) slot on `zones/{fleet~zone~type}`, with
  the new queued resource's record in the same commit.
The scheduler's guard and the janitor's guard are this same mechanism over the
same `tpus/{node}` document, so an assignment racing a deletion has exactly
one winner: whichever commits first changes the update time the other's
precondition names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from google.api_core.exceptions import Aborted, AlreadyExists, Conflict, FailedPrecondition, NotFound

from tpuq.contracts.errors import Retryable
from tpuq.runtime import tickdue

T = TypeVar("T")
# What a lost race looks like: a precondition failed, the document appeared (create), or it vanished (update).
LOST_RACE = (FailedPrecondition, AlreadyExists, Aborted, Conflict, NotFound)


@dataclass(frozen=True)
class Seen:
    """A document as a decision saw it, when only its version was kept (not the whole snapshot): the same
    precondition as a snapshot's. `update_time` None: the decision saw it absent."""

    reference: Any
    update_time: Any = None

    @property
    def exists(self) -> bool:
        return self.update_time is not None


@dataclass
class WriteSet:
    """Writes guarded by the snapshots they were decided from."""

    guarded: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)  # (snapshot, fields)
    unguarded: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)  # (reference, fields), merged
    replaced: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)  # (reference, whole document)

    def update(self, snapshot, fields: dict[str, Any] | None) -> "WriteSet":
        """Write `fields` to the snapshot's document only if it has not changed since the snapshot.

        An absent snapshot makes the write a create: it fails if the document appeared meanwhile.
        """
        if fields:
            self.guarded.append((snapshot, fields))
        return self

    def merge(self, reference, fields: dict[str, Any] | None) -> "WriteSet":
        """A write that needs no guard of its own (a child of a guarded document)."""
        if fields:
            self.unguarded.append((reference, fields))
        return self

    def replace(self, reference, document: dict[str, Any]) -> "WriteSet":
        """A whole document written in the same commit, replacing what is there (a record the guard protects)."""
        self.replaced.append((reference, document))
        return self

    def __bool__(self) -> bool:
        return bool(self.guarded or self.unguarded or self.replaced)


def commit_if_unchanged(db, writes: WriteSet) -> bool:
    """Commit atomically; False when any guarded document changed (or appeared, or vanished) meanwhile."""
    return commit_guarded(db, writes) is not None


def commit_guarded(db, writes: WriteSet) -> list | None:
    """Commit atomically and return the write results, the guarded writes' first and in order (their update
    times are the new versions); None when any guarded document changed (or appeared, or vanished) meanwhile."""
    if not writes:
        return []
    batch = db.batch()
    for snap, fields in writes.guarded:
        if snap.exists:
            batch.update(snap.reference, fields, option=db.write_option(last_update_time=snap.update_time))
        else:
            batch.create(snap.reference, fields)
    for ref, fields in writes.unguarded:
        batch.set(ref, fields, merge=True)
    for ref, document in writes.replaced:
        batch.set(ref, document)
    written = [(snap.reference, fields) for snap, fields in writes.guarded] + writes.unguarded + writes.replaced
    if any(tickdue.wakes_janitor(ref.path, fields) for ref, fields in written):
        # A TPU idle or deleting: the janitor's tick has work from now (its `due_at`, in the same commit).
        tickdue.wake_janitor(batch, db)
    try:
        return list(batch.commit())
    except LOST_RACE:
        return None


def read_all(db, refs: list) -> list:
    """The snapshots of `refs`, in their order, read in one round trip (`get_all` answers in any order; a document
    that does not exist comes back as a snapshot that says so)."""
    if len(refs) <= 1:
        return [ref.get() for ref in refs]
    by_path = {snap.reference.path: snap for snap in db.get_all(refs)}
    return [by_path[ref.path] for ref in refs]


def read_decide_commit(db, refs: list, decide: Callable[..., tuple[WriteSet, T]], attempts: int = 6,
                       then: Callable[[list], list] | None = None) -> T:
    """Read `refs`, let `decide(*snapshots)` choose writes, commit them unless something changed; repeat.

    `decide` must be pure apart from its arguments: it runs again on fresh
    snapshots whenever a concurrent writer won. `then(snapshots)`: more documents, known only from those read (a
    multislice job's other slices, from the job); read after them and passed to `decide` after theirs, guarded too.
    """
    for _ in range(attempts):
        snaps = read_all(db, refs)
        if then is not None:
            snaps += read_all(db, then(snaps))
        writes, result = decide(*snaps)
        if commit_if_unchanged(db, writes):
            return result
    raise Retryable(f"documents {[r.path for r in refs]} kept changing; will retry")
