"""Stored documents parsed once per stored version, for the life of a service process.

A snapshot's `update_time` names its stored version: Firestore gives every write a new one, so the same
(document, update_time) is the same content, and what was parsed from it can be used again. Nothing here
decides: a kept parse is exactly what parsing again would give. Who uses it:
- the scheduler's pass reads up to `PER_TYPE_EXTRA` pending jobs of every type, and its tick's backstop up to
  50 running jobs; most are the same stored versions as the pass before (a job waits for hours without a
  write). Copying each out of its snapshot and validating its spec again was most of a pass's CPU
  (`benchmarks/bench_pass.py`: parsing 10,000 stored jobs 0.4-1.0 s, deciding 0.5-0.7 s);
- the claimer's load reads every live queued resource and open request of the fleet, each handling.

The kept documents and parses are shared between handlings and must not be changed: the readers only read
them (their writes are new maps, their records frozen and replaced). Kept per Firestore client (the
emulator's, production's, a simulation's in-memory store), so two stores never share a version; a store that
cannot be weakly referenced keeps nothing. A write that changes nothing keeps its document's update_time
(Firestore's WriteResult): the content is the same, so the kept parse still is.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Documents kept per kind, the least lately read dropped first. A pass reads (types x (idle TPUs + 64)) pending
# jobs, a few hundred in a fleet like the standard scenario's; a larger read than this is parsed again in part
# each pass (CPU only). A job's document is a few KB (up to Firestore's 1 MiB): a few to tens of MB per kind.
DEFAULT_LIMIT = 4_096


class Versioned(Generic[T]):
    """(document path) -> (update_time, the document as read, parse(id, document)); `get` parses a new version."""

    def __init__(self, parse: Callable[[str, dict], T], limit: int = DEFAULT_LIMIT) -> None:
        self.parse = parse
        self.limit = limit
        self._kept: OrderedDict[str, tuple[Any, dict, T]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, snap) -> tuple[dict, T]:
        """The snapshot's document (not to be changed) and its parse, from the kept ones if this version is kept.
        A parse that raises is not kept."""
        version = getattr(snap, "update_time", None)
        reference = getattr(snap, "reference", None)
        key = getattr(reference, "path", None) or snap.id  # a document's path: two collections never collide
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and version is not None and kept[0] == version:
                self._kept.move_to_end(key)
                self.hits += 1
                return kept[1], kept[2]
        doc = snap.to_dict() or {}
        parsed = self.parse(snap.id, doc)
        with self._lock:
            self.misses += 1
            kept = self._kept.get(key)
            if version is not None and self.limit and not (kept is not None and kept[0] > version):
                # (a slower reader of an older version does not replace a newer one)
                self._kept[key] = (version, doc, parsed)
                self._kept.move_to_end(key)
                while len(self._kept) > self.limit:
                    self._kept.popitem(last=False)
        return doc, parsed


_BY_CLIENT: "weakref.WeakKeyDictionary[Any, dict[str, Versioned]]" = weakref.WeakKeyDictionary()
_BY_CLIENT_LOCK = threading.Lock()


def versioned(db, kind: str, parse: Callable[[str, dict], T]) -> Versioned[T]:
    """This Firestore client's kept parses of one kind (`kind` names the parse: one parse per kind)."""
    with _BY_CLIENT_LOCK:
        try:
            kinds = _BY_CLIENT.setdefault(db, {})
        except TypeError:  # not weakly referenceable: keep nothing
            return Versioned(parse, limit=0)
        kept = kinds.get(kind)
        if kept is None:
            kept = kinds[kind] = Versioned(parse)
        return kept
