"""Shell (Firestore): one instance's copy of a set of documents, kept current by reading only what was written.

A tick reads the same documents every minute (a fleet's live queued resources, its race targets) to find the few
that changed. Firestore bills every document a query returns, so that costs reads in proportion to what exists,
not to what changed (issue 34 §1). A `DeltaView` keeps the set in the instance's memory and asks only for the
documents written since its last read: every writer of those documents stamps `WRITTEN_AT` with the server's
commit time (`stamped`), and the view queries `WRITTEN_AT > last read - OVERLAP`. A query that matches nothing is
billed one read.

Why it stays exact whatever wrote what, on whichever instance:
- a write's stamp is the server's commit time, and a query sees every commit up to its read time
  (https://firebase.google.com/docs/firestore/understand-reads-writes-scale: strong consistency for reads and
  queries). The view's last read time is taken on this instance's clock before the query is sent; `OVERLAP`
  covers any distance between that clock and Google's;
- a document that leaves the set (a queued resource no longer live) is still written, so it is seen and dropped;
- a cold instance (nothing read yet) and, on the backstop cadence, every instance read the whole set again: a
  writer that did not stamp (an older version during a rolling deploy, a person's edit in the console) is caught
  within that period.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable

from google.api_core.exceptions import FailedPrecondition
from google.cloud.firestore import SERVER_TIMESTAMP, FieldFilter

from tpuq.runtime.cadence import is_due

log = logging.getLogger("tpuq.runtime.deltaread")

WRITTEN_AT = "written_at"  # the server's commit time of the document's last write (`stamped`)
# A query sees every commit stamped up to its read time (Firestore reads are strongly consistent), and this
# instance's clock is read before the query is sent: the overlap covers only the distance between this clock and
# Google's, with a wide margin. Documents written within it are read again by the next query.
OVERLAP = timedelta(seconds=30)


def stamped(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with `WRITTEN_AT` set to the commit time: every write of a document a `DeltaView` reads uses it."""
    return {**doc, WRITTEN_AT: SERVER_TIMESTAMP}


@dataclass
class DeltaView:
    """The documents `scope(db)` returns that `keep(doc)` accepts, read whole at first and on `full_every`, in
    between only those written since (by `WRITTEN_AT`). `scope` must not filter on what `keep` tests: a document
    that stops being kept must still come back, to be dropped. Safe for concurrent handlers of one instance."""

    scope: Callable[[Any], Any]  # db -> the query of every document that may belong (e.g. one fleet's)
    keep: Callable[[dict], bool]
    full_every: timedelta
    whole: Callable[[Any], Any] | None = None  # db -> the cheaper query for a whole read (default: scope + keep)
    _docs: dict[str, Any] = field(default_factory=dict, repr=False)  # id -> snapshot
    _read_at: datetime | None = field(default=None, repr=False)  # when the last query began (this clock)
    _full_at: datetime | None = field(default=None, repr=False)
    _settled: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def read(self, db, now: datetime) -> list[Any]:
        """The set's snapshots as of now: one query (a whole read when cold or due)."""
        with self._lock:
            if self._read_at is None or is_due(self._full_at, now, self.full_every):
                self._read_whole(db)
                self._full_at = now
            else:
                try:
                    self._read_since(db, self._read_at - OVERLAP)
                except FailedPrecondition as e:
                    # The composite index (scope's fields + `written_at`) is still being built after a deploy
                    # (minutes): read the whole set until it serves.
                    log.warning("a query of what was written since needs its index, not ready yet: %s", e)
                    self._read_whole(db)
            self._read_at = now
            return list(self._docs.values())

    def _read_whole(self, db) -> None:
        query = self.whole(db) if self.whole is not None else self.scope(db)
        self._docs = {s.id: s for s in query.stream() if self.keep(s.to_dict() or {})}
        self._settled = False

    def _read_since(self, db, since: datetime) -> None:
        self._settled = True
        for snap in self.scope(db).where(filter=FieldFilter(WRITTEN_AT, ">", since)).stream():
            self._settled = False
            if self.keep(snap.to_dict() or {}):
                self._docs[snap.id] = snap
            else:
                self._docs.pop(snap.id, None)

    @property
    def settled(self) -> bool:
        """The last read asked for what was written since and found nothing: with nothing written meanwhile, the
        next read costs the same (one read). After a whole read or one that found documents it costs less."""
        return self._settled

    def forget(self) -> None:
        """Read the whole set next time (a nudge: a person changed something the stamps may not show)."""
        with self._lock:
            self._read_at = None
