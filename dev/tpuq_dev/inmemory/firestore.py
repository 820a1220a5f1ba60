"""An in-memory Firestore with `google.cloud.firestore.Client`'s call shapes.

It implements every operation the services use (grep shared/ and services/ for them):
- `db.collection(...).document(...)`, subcollections, `ref.get()`, `db.get_all(refs)`;
- `set` (with `merge=True`), `update` (dotted field paths; `option=db.write_option(last_update_time=...)` or
  `exists=...`), `create` (AlreadyExists), `delete`;
- `db.batch()` ... `commit()`: all or nothing, each write's precondition checked in order;
- `db.transaction()` with `@firestore.transactional` (optimistic here; a changed read aborts and retries);
- the transforms `Increment`, `Maximum`, `Minimum`, `ArrayUnion`, `ArrayRemove`, `SERVER_TIMESTAMP`, `DELETE_FIELD`;
- queries: `where(field, op, value)` and `where(filter=FieldFilter(...))` with `==`, `!=`, `<`, `<=`, `>`, `>=`,
  `in`, `not-in`, `array_contains`, `array_contains_any`; `order_by`, `limit`, `offset`, `stream()`, `get()`,
  `count()`.

Firestore's behaviour it keeps, because our code would notice the difference
(each one is checked against the emulator by `tests/contract/`):
- every commit gets a strictly later update time, shared by all its writes; a
  write that changes nothing keeps the document's update time;
- a query never matches a document without the field (and `!=` / `not-in`
  never match null); `==` and `<` compare only values of the same type
  (1 == 1.0, but True != 1; a string is never "<=" a timestamp), and ordering
  across types follows Firestore's type order;
- `order_by` drops documents without that field; ties (and queries without
  `order_by`) come in document-id order;
- values come back as Firestore returns them: copies, lists for tuples, plain
  str/int for enum members, timestamps as UTC-aware datetimes (naive ones are
  taken as UTC, as the client does), sets as arrays; a value the client cannot
  send raises TypeError;
- `get_all` yields in no promised order (here: shuffled, seeded), so a caller
  that leaned on the order asked would fail here too;
- a document over 1 MiB by Firestore's size rules, or a field value over
  1 MiB - 89 bytes, is refused with InvalidArgument and nothing of the commit
  is written, as Firestore and its emulator refuse it (`_sized`);
- a commit (batch or transaction) of more than 500 writes is refused with InvalidArgument, nothing written
  (https://cloud.google.com/firestore/quotas#writes_and_transactions).
Not modelled: indexes (production needs the composite ones in infra/) and
limits on write rate.
"""

from __future__ import annotations

import bisect
import copy
import functools
import heapq
import random
import string
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Iterator, Protocol

from google.api_core.datetime_helpers import DatetimeWithNanoseconds
from google.api_core.exceptions import Aborted, AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from google.cloud.firestore_v1 import transforms
from google.cloud.firestore_v1.base_aggregation import AggregationResult

MAX_WRITES_PER_COMMIT = 500  # Firestore's limit on one commit's writes (module docstring)

ASCENDING, DESCENDING = "ASCENDING", "DESCENDING"  # the values of google.cloud.firestore.Query's constants
_MISSING = object()
_MAX_IN_VALUES = 30  # Firestore refuses larger `in` / `not-in` / `array_contains_any` lists
_INEQUALITIES = ("<", "<=", ">", ">=", "!=", "not-in")
# Firestore's "Quotas and limits" page (cloud.google.com/firestore/quotas): a document holds at most 1 MiB and a
# field value at most 1 MiB - 89 bytes; a write over either fails with INVALID_ARGUMENT (production-facts.md,
# "Firestore document size"). The emulator refuses both as well ("maximum entity size is 1048576 bytes"; "The
# value of property "x" is longer than 1048487 bytes").
MAX_DOCUMENT_BYTES = 1_048_576
MAX_FIELD_VALUE_BYTES = 1_048_487


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


# ------------------------------------------------------------------ values


def _encode(value: Any, in_array: bool = False) -> Any:
    """A value as Firestore stores it (and hands back), or TypeError for what it cannot store."""
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)  # an enum member's text, as the client sends it
    if type(value) is DatetimeWithNanoseconds and value.tzinfo is timezone.utc \
            and not getattr(value, "_nanosecond", 0):
        return value  # already as stored (immutable): a stored time written back, a read time
    if isinstance(value, datetime):
        if value.tzinfo is timezone.utc:
            utc = value  # its fields are already UTC's (converting a traced now would make another traced now)
        else:
            utc = (value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
        return DatetimeWithNanoseconds(utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second,
                                       utc.microsecond, tzinfo=timezone.utc)
    if isinstance(value, (list, tuple, set, frozenset)):  # the client sends a set as an array too
        if in_array:
            raise InvalidArgument("Cannot convert an array value in an array value.")
        return [_encode(v, in_array=True) for v in value]
    if isinstance(value, dict):
        if any(not isinstance(k, str) for k in value):
            raise TypeError(f"Cannot convert to a Firestore Value: map keys must be strings: {value!r}")
        return {k: _encode(v) for k, v in value.items()}
    raise TypeError(f"Cannot convert to a Firestore Value: {value!r} (type {type(value).__name__})")


def _string_size(text: str) -> int:
    """Firestore's "Storage size calculations" (cloud.google.com/firestore/docs/storage-size): UTF-8 bytes + 1."""
    if text.isascii():  # most names and values: one byte a character, without encoding
        return len(text) + 1
    return len(text.encode("utf-8", errors="surrogatepass")) + 1


def _value_size(value: Any) -> int:
    """A stored value's size by the same page: null and booleans 1, numbers and times 8, bytes their length,
    arrays their values, maps their keys and values."""
    kind = type(value)
    if kind is str:
        return _string_size(value)
    if kind is dict:
        return sum(_string_size(k) + _value_size(v) for k, v in value.items())
    if kind is list:
        return sum(_value_size(v) for v in value)
    if value is None or kind is bool:
        return 1
    if kind is bytes:
        return len(value)
    return 8  # int, float, a timestamp: the only other values `_encode` stores


def _field_size(name: str, value: Any) -> int:
    return _string_size(name) + _value_size(value)


def _name_size(path: str) -> int:
    """A document name's size: each collection and document id of its path, + 16."""
    return sum(_string_size(segment) for segment in path.split("/")) + 16


def document_size(path: str, data: dict) -> int:
    """The stored size of document `path` holding `data`: its name, its fields' names and values, + 32."""
    return _name_size(path) + sum(_field_size(k, v) for k, v in data.items()) + 32


def _refuse_oversized_value(path: str, name: str, value: Any) -> None:
    kind = type(value)
    if kind is str or kind is bytes:
        length = len(value.encode("utf-8", errors="surrogatepass")) if kind is str else len(value)
        if length > MAX_FIELD_VALUE_BYTES:
            raise InvalidArgument(f"The value of property {name!r} of {path} is longer than {MAX_FIELD_VALUE_BYTES} "
                                  "bytes.")


def _sized(write: "_Write", current: "_Stored | None", after: "_Stored") -> None:
    """Set `after.size`, or raise InvalidArgument as Firestore does for a document or field value over its limit.
    A merge or an update changes only the top-level fields it names, so only those are measured again."""
    if current is None or (write.kind != "update" and not write.merge):
        touched = after.data.keys()
        size = document_size(write.path, after.data)
    else:
        touched = {key.split(".", 1)[0] for key in (write.data or {})}
        size = current.size
        for name in touched:
            if name in current.data:
                size -= _field_size(name, current.data[name])
            if name in after.data:
                size += _field_size(name, after.data[name])
    for name in touched:
        if name in after.data:
            _refuse_oversized_value(write.path, name, after.data[name])
    if size > MAX_DOCUMENT_BYTES:
        raise InvalidArgument(f"Document {write.path} cannot be written because its size ({size:,} bytes) exceeds "
                              f"the maximum allowed size of {MAX_DOCUMENT_BYTES:,} bytes.")
    after.size = size


def _copy(value: Any) -> Any:
    """A stored value's copy: stored values are only maps, arrays and immutable scalars (`_encode`)."""
    kind = type(value)
    if kind is dict:
        return {k: (_copy(v) if type(v) in _CONTAINERS else v) for k, v in value.items()}
    if kind is list:
        return [(_copy(v) if type(v) in _CONTAINERS else v) for v in value]
    return value


_CONTAINERS = (dict, list)


def _flat(container: dict | list) -> bool:
    """Whether a map or array holds no map or array (its shallow copy shares only immutable values)."""
    values = container.values() if type(container) is dict else container
    return not any(type(v) in _CONTAINERS for v in values)


def _index_key(value: Any) -> Any:
    """What an equality index files a scalar under (None: not indexed; such filters scan). Keys are equal
    exactly when `_equal` says the values are: 1 == 1.0, but True is not 1."""
    kind = type(value)
    if value is None:
        return (0, None)
    if kind is bool:
        return (1, value)
    if kind in (int, float):
        return None if value != value else (2, value)  # NaN equals nothing
    if kind is str:
        return (4, value)
    return None


def _index_values(data: dict | None, field: str, elements: bool) -> list[Any]:
    if data is None:
        return []
    value = _lookup(data, field)
    if value is _MISSING:
        return []
    if elements:
        return [k for k in {_index_key(v) for v in value} if k is not None] if isinstance(value, list) else []
    key = _index_key(value)
    return [] if key is None else [key]


def _index(index: dict, field: str, elements: bool, doc_id: str, data: dict | None) -> None:
    for key in _index_values(data, field, elements):
        index.setdefault(key, set()).add(doc_id)


def _unindex(index: dict, field: str, elements: bool, doc_id: str, data: dict | None) -> None:
    for key in _index_values(data, field, elements):
        ids = index.get(key)
        if ids is not None:
            ids.discard(doc_id)
            if not ids:
                del index[key]


# Firestore's order of value types: null < boolean < number < timestamp < string < bytes < array < map.
def _type_rank(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool):
        return 1
    if isinstance(value, (int, float)):
        return 2
    if isinstance(value, datetime):
        return 3
    if isinstance(value, str):
        return 4
    if isinstance(value, bytes):
        return 5
    if isinstance(value, list):
        return 8
    if isinstance(value, dict):
        return 9
    raise TypeError(f"not a Firestore value: {value!r}")


def _order_key(value: Any) -> tuple:
    rank = _type_rank(value)
    if rank == 8:
        return rank, tuple(_order_key(v) for v in value)
    if rank == 9:
        return rank, tuple((k, _order_key(value[k])) for k in sorted(value))
    return rank, value if rank else 0


class _Reversed:
    """An order key that sorts the other way (a DESCENDING order_by in a composite key)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and self.key == other.key

    def __lt__(self, other: "_Reversed") -> bool:
        return other.key < self.key

    def __gt__(self, other: "_Reversed") -> bool:
        return self.key < other.key

    def __le__(self, other: "_Reversed") -> bool:
        return not self.key < other.key

    def __ge__(self, other: "_Reversed") -> bool:
        return not other.key < self.key


class _OrderedView:
    """The documents of one collection that meet every condition (field, value key, by array element?): a field
    equal to the value, or an array field holding it; in the order a query ordered by `orders` returns them (the
    last tie-break is the id, in the last order's direction; a document without an order field is left out, as
    Firestore leaves it out). Kept up to date by every write, as Firestore keeps a composite index, so a query with
    a limit reads its first matches without sorting the whole collection."""

    def __init__(self, conditions: tuple[tuple[str, Any, bool], ...], orders: tuple[tuple[str, str], ...]) -> None:
        self.conditions, self.orders = conditions, orders
        self._id_reversed = bool(orders) and orders[-1][1] == DESCENDING  # no orders: by id, ascending
        self.entries: list[tuple] = []  # sorted composite keys; each ends with its document's id
        self._keys: dict[str, tuple] = {}

    def _meets(self, data: dict) -> bool:
        return all(key in _index_values(data, field, elements) for field, key, elements in self.conditions)

    def _sort_key(self, doc_id: str, data: dict | None) -> tuple | None:
        if data is None or not self._meets(data):
            return None
        parts: list[Any] = []
        for field, direction in self.orders:
            value = _lookup(data, field)
            if value is _MISSING:
                return None
            parts.append(_Reversed(_order_key(value)) if direction == DESCENDING else _order_key(value))
        parts.append(_Reversed(doc_id) if self._id_reversed else doc_id)
        return tuple(parts)

    def update(self, doc_id: str, data: dict | None) -> None:
        old = self._keys.pop(doc_id, None)
        if old is not None:
            at = bisect.bisect_left(self.entries, old)
            if at < len(self.entries) and self.entries[at] is old:
                del self.entries[at]
            else:  # a key bisect cannot place (NaN orders with nothing): found by identity
                del self.entries[next(i for i, e in enumerate(self.entries) if e is old)]
        new = self._sort_key(doc_id, data)
        if new is not None:
            bisect.insort(self.entries, new)
            self._keys[doc_id] = new



def _ids_in_order(views: list[_OrderedView]) -> Iterator[str]:
    """The ids of every document in any of the views (of one order), in that order, each once."""
    entries = views[0].entries if len(views) == 1 else heapq.merge(*(v.entries for v in views))
    previous = None
    for entry in entries:
        if entry == previous:
            continue  # in two of the views (an array holding two of the values asked for)
        previous = entry
        last = entry[-1]
        yield last.key if isinstance(last, _Reversed) else last


_PLAIN = frozenset({str, int, bool, type(None)})  # equal as Firestore compares them iff equal in Python


def _equal(a: Any, b: Any) -> bool:
    kind = type(a)
    if kind is type(b) and kind in _PLAIN:  # the common case, without building order keys
        return a == b
    return _type_rank(a) == _type_rank(b) and _order_key(a) == _order_key(b)


def _field_path(path: str) -> list[str]:
    return path.split(".")


def _lookup(data: dict, path: str) -> Any:
    if "." not in path:  # a top-level field: most lookups
        return data.get(path, _MISSING) if isinstance(data, dict) else _MISSING
    node: Any = data
    for part in _field_path(path):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


# ------------------------------------------------------------------ writes


def _transformed(existing: Any, value: Any, commit_time: datetime) -> Any:
    """The stored value after writing `value` over `existing` (_MISSING when absent)."""
    if value is transforms.SERVER_TIMESTAMP:
        return commit_time
    if isinstance(value, transforms.Increment):
        if isinstance(existing, (int, float)) and not isinstance(existing, bool):
            return existing + value.value
        return value.value
    if isinstance(value, (transforms.Maximum, transforms.Minimum)):
        if isinstance(existing, (int, float)) and not isinstance(existing, bool):
            pick = max if isinstance(value, transforms.Maximum) else min
            return pick(existing, value.value)
        return value.value
    if isinstance(value, transforms.ArrayUnion):
        current = list(existing) if isinstance(existing, list) else []
        for v in _encode(list(value.values)):
            if not any(_equal(v, c) for c in current):
                current.append(v)
        return current
    if isinstance(value, transforms.ArrayRemove):
        removed = _encode(list(value.values))
        return [c for c in existing if not any(_equal(c, r) for r in removed)] if isinstance(existing, list) else []
    return _encode(value)


def _no_delete_field(data: Any, request: str) -> None:
    if data is transforms.DELETE_FIELD:
        raise ValueError(f"Cannot apply DELETE_FIELD in a {request} request.")
    if isinstance(data, dict):
        for v in data.values():
            _no_delete_field(v, request)


def _build(data: dict, commit_time: datetime) -> dict:
    """A whole new document (set without merge, create)."""
    out = {}
    for key, value in data.items():
        if type(value) in _STORED_AS_IS:
            out[key] = value  # what `_transformed` would answer for it: itself
        else:
            out[key] = (_build(value, commit_time) if isinstance(value, dict)
                        else _transformed(_MISSING, value, commit_time))
    return out


_STORED_AS_IS = frozenset({str, int, float, bool, bytes, type(None)})  # exact types `_encode` hands back unchanged


def _merge_into(target: dict, data: dict, commit_time: datetime) -> None:
    """set(merge=True): nested maps merge leaf by leaf; an empty map is a leaf."""
    for key, value in data.items():
        if value is transforms.DELETE_FIELD:
            target.pop(key, None)
        elif isinstance(value, dict) and value:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            _merge_into(target[key], value, commit_time)
        else:
            target[key] = _transformed(target.get(key, _MISSING), value, commit_time)


def _update_into(target: dict, fields: dict, commit_time: datetime) -> None:
    """update(): each key is a field path whose value replaces what is there (maps included)."""
    for path, value in fields.items():
        *parents, leaf = _field_path(path)
        node = target
        for part in parents:
            if not isinstance(node.get(part), dict):
                if value is transforms.DELETE_FIELD:
                    node = None
                    break
                node[part] = {}
            node = node[part]
        if node is None:
            continue
        if value is transforms.DELETE_FIELD:
            node.pop(leaf, None)
        elif isinstance(value, dict):
            node[leaf] = _build(value, commit_time)
        else:
            node[leaf] = _transformed(node.get(leaf, _MISSING), value, commit_time)


@dataclass(frozen=True)
class LastUpdateOption:
    """`db.write_option(last_update_time=...)`: the write lands only on exactly that version."""

    last_update_time: datetime


@dataclass(frozen=True)
class ExistsOption:
    """`db.write_option(exists=...)`."""

    exists: bool


@dataclass(frozen=True)
class WriteResult:
    update_time: datetime | None


@dataclass
class _Stored:
    data: dict
    create_time: datetime
    update_time: datetime
    # Its fields holding maps or arrays, each with whether it holds only scalars (then a shallow copy is a copy).
    containers: tuple[tuple[str, bool], ...] = field(init=False, repr=False)
    size: int = field(default=0, repr=False, compare=False)  # Firestore's storage size, set by `_sized` on commit

    def __post_init__(self) -> None:
        self.containers = tuple((k, _flat(v)) for k, v in self.data.items() if type(v) in _CONTAINERS)


@dataclass(frozen=True)
class _Write:
    kind: str  # create | set | update | delete
    path: str
    data: dict | None = None
    merge: bool = False
    option: Any = None


def _check_option(option: Any, current: _Stored | None, path: str) -> None:
    if option is None:
        return
    if isinstance(option, LastUpdateOption):
        if current is None or current.update_time != option.last_update_time:
            raise FailedPrecondition(f"the stored version of {path} does not match the required base version")
    elif isinstance(option, ExistsOption):
        if option.exists and current is None:
            raise NotFound(f"No document to update: {path}")
        if not option.exists and current is not None:
            raise AlreadyExists(f"Document already exists: {path}")
    else:
        raise TypeError(f"unknown write option {option!r}")


def _apply(write: _Write, current: _Stored | None, commit_time: datetime) -> _Stored | None:
    """The document after `write`, or the exception Firestore answers with."""
    if write.kind == "create":
        if current is not None:
            raise AlreadyExists(f"Document already exists: {write.path}")
        return _Stored(_build(write.data or {}, commit_time), commit_time, commit_time)
    if write.kind == "delete":
        _check_option(write.option, current, write.path)
        return None
    if write.kind == "set":
        data = _copy(current.data) if (current is not None and write.merge) else {}
        if write.merge:
            _merge_into(data, write.data or {}, commit_time)
        else:
            data = _build(write.data or {}, commit_time)
    else:  # update
        if write.option is None and current is None:
            raise NotFound(f"No document to update: {write.path}")
        _check_option(write.option, current, write.path)
        assert current is not None
        data = _copy(current.data)
        _update_into(data, write.data or {}, commit_time)
    if current is None:
        return _Stored(data, commit_time, commit_time)
    if data == current.data:
        return current  # nothing changed: the update time stays (Firestore's WriteResult says the same)
    return _Stored(data, current.create_time, commit_time)


# ------------------------------------------------------------------ the client


@dataclass
class BilledOps:
    """Document reads, writes and deletes, counted as Firestore bills them (`MemoryFirestore.billed`)."""

    reads: int = 0
    writes: int = 0
    deletes: int = 0

    def copy(self) -> "BilledOps":
        return BilledOps(self.reads, self.writes, self.deletes)

    def __sub__(self, other: "BilledOps") -> "BilledOps":
        return BilledOps(self.reads - other.reads, self.writes - other.writes, self.deletes - other.deletes)

    def add(self, other: "BilledOps") -> None:
        self.reads += other.reads
        self.writes += other.writes
        self.deletes += other.deletes


class StoreObserver(Protocol):
    """What a `MemoryFirestore` tells its observer. Documents are told as full paths; a query as its collection's
    path and its filters (`_Filter.matches` says whether a document's data would be among its results)."""

    def read_document(self, path: str) -> None: ...

    def read_query(self, collection_path: str, filters: tuple["_Filter", ...]) -> None: ...

    def changed(self, path: str, before: dict | None, after: dict | None) -> None: ...


class MemoryFirestore:
    """One in-memory database. Thread-safe: every read and commit holds one lock."""

    def __init__(self, project: str = "tpuq-local", now: Callable[[], datetime] = _utcnow,
                 rng: random.Random | None = None):
        self.project = project
        self._now = now
        self._rng = rng or random.Random(0)
        self._order_seed = self._rng.randrange(2 ** 32)
        self._collections: dict[str, dict[str, _Stored]] = {}  # collection path -> document id -> document
        self._lock = threading.RLock()
        self._last_commit: datetime | None = None
        self._time_raw: Any = None  # the clock's last answer, and its encoding (`_time`)
        self._time_encoded: datetime | None = None
        self._after_last: tuple[datetime, datetime] | None = None  # the last commit, and the instant just after it
        self._collection_refs: dict[tuple[str, ...], MemoryCollection] = {}  # `collection(*path)`, kept
        self.changes = 0  # documents created, changed or deleted (a write that changes nothing is not counted)
        # Operations as Firestore bills them: a document got is one read; a query one read per document it
        # returns or skips by an offset, and one when it returns none; a count one per 1,000 index entries (at
        # least one); each write and delete of a commit one (the simulator reports what the services would cost).
        self.billed = BilledOps()
        # Equality indexes, made on a query's first use and kept up to date by every write: collection path ->
        # (field, by array element?) -> value key -> document ids. Only the speed of queries depends on them.
        self._indexes: dict[str, dict[tuple[str, bool], dict[Any, set[str]]]] = {}
        # Ordered views, made on a limited ordered query's first use: collection path -> (field, value key,
        # orders) -> the view. Only the speed of queries depends on them too.
        self._views: dict[str, dict[tuple, _OrderedView]] = {}
        # The same views filed by their first condition: collection path -> (field, by array element?) -> value
        # key -> views. A write updates only the views its old or new document meets the first condition of (a
        # view per request id or per fleet would otherwise be updated by every write of the collection).
        self._view_routes: dict[str, dict[tuple[str, bool], dict[Any, list[_OrderedView]]]] = {}
        # Told of every read and every change (the simulator's quiet ticks: tpuq_dev.simulate.tpuq_policy); None: nobody.
        self.observer: StoreObserver | None = None

    # ---- references
    def collection(self, *path: str) -> "MemoryCollection":
        known = self._collection_refs.get(path)
        if known is not None:
            return known  # a reference holds nothing that changes: one per path serves every caller
        parts = _split(path)
        if len(parts) % 2 != 1:
            raise ValueError(f"a collection path has an odd number of parts: {'/'.join(parts)!r}")
        reference = MemoryCollection(self, tuple(parts))
        if len(self._collection_refs) < 10_000:
            self._collection_refs[path] = reference
        return reference

    def document(self, *path: str) -> "MemoryDocument":
        parts = _split(path)
        if len(parts) % 2 != 0 or not parts:
            raise ValueError(f"a document path has an even number of parts: {'/'.join(parts)!r}")
        return MemoryDocument(self, tuple(parts))

    # ---- reads
    def get_all(self, references: Iterable["MemoryDocument"], field_paths=None, transaction=None,
                **_: Any) -> Iterator["MemorySnapshot"]:
        unique = list({ref.path: ref for ref in references}.values())
        with self._lock:
            # Firestore answers in no promised order: callers must map results by id. The order is drawn from the
            # read and the store's state, not from a stream, so one read more or fewer elsewhere changes no other.
            if len(unique) > 1:
                random.Random(f"{self._order_seed}:{self.changes}:{len(unique)}:{unique[0].path}").shuffle(unique)
            snaps = [self._snapshot(ref) for ref in unique]
        for snap in snaps:
            if transaction is not None:
                transaction._read(snap)
            yield snap

    def _snapshot(self, ref: "MemoryDocument") -> "MemorySnapshot":
        if self.observer is not None:
            self.observer.read_document(ref.path)
        self.billed.reads += 1
        stored = self._stored(ref.path)
        read_time = self._time()
        if stored is None:
            return MemorySnapshot(ref, None, None, None, read_time)
        return MemorySnapshot(ref, stored.data, stored.create_time, stored.update_time, read_time, stored.containers)

    def _candidates(self, collection_path: str, filters) -> list[tuple[str, _Stored]]:
        """The documents that can match `filters`, as (id, document) in id order: from an equality index when a
        filter allows one."""
        best: set[str] | None = None
        for f in filters:
            if f.op in ("==", "in", "array_contains", "array_contains_any"):
                values = f.value if f.op in ("in", "array_contains_any") else [f.value]
                keys = [_index_key(v) for v in values]
                if any(k is None for k in keys):
                    continue
                index = self._index_for(collection_path, f.field, f.op.startswith("array"))
                # One value's ids are the index's own set (not copied: only read here, before any write); a
                # union is made only when it can be the smallest (an equality on a collection's whole history,
                # `fleet == x`, is then never copied when another filter narrows it).
                buckets = [index.get(k, ()) for k in keys]
                if best is not None and sum(map(len, buckets)) >= len(best):
                    continue
                ids = buckets[0] if len(buckets) == 1 else set().union(*buckets)
                if best is None or len(ids) < len(best):
                    best = ids
        docs = self._collections.get(collection_path, {})
        if best is None:
            return [(doc_id, docs[doc_id]) for doc_id in sorted(docs)]
        return [(doc_id, docs[doc_id]) for doc_id in sorted(best) if doc_id in docs]

    def _candidates_from(self, collection_path: str, filters, field: str,
                         lower: datetime) -> list[tuple[str, _Stored]]:
        """The documents that can match `filters` and may hold a timestamp at or after `lower` in `field`, in no
        promised order: from the ordered view of the filters' equalities by `field`, from `lower` on, as a
        composite index answers a range (`_views_for`); without an equality filter, `_candidates`' (every
        document they allow). A superset of those matching `filters` whose `field` is a time >= `lower`."""
        views = self._views_for(collection_path, filters, ((field, ASCENDING),))
        if views is None:
            return self._candidates(collection_path, filters)
        docs = self._collections.get(collection_path, {})
        start = (_order_key(lower),)
        seen: set[str] = set()
        out = []
        for view in views:
            entries = view.entries
            for entry in entries[bisect.bisect_left(entries, start):]:
                doc_id = entry[-1]
                if doc_id not in seen:
                    seen.add(doc_id)
                    out.append((doc_id, docs[doc_id]))
        return out

    def _views_for(self, collection_path: str, filters, orders: tuple) -> list[_OrderedView] | None:
        """Ordered views whose union holds every document an ordered query's equality filters can match (its
        `==` and `array_contains` filters in each, and one per value of its first `in` or `array_contains_any`);
        None when the query has no such filter. A query without orders is in id order, as Firestore answers it."""
        fixed: list[tuple[str, Any, bool]] = []
        split: list[tuple[str, Any, bool]] | None = None
        for f in filters:
            if f.op in ("==", "array_contains"):
                key = _index_key(f.value)
                if key is not None:
                    fixed.append((f.field, key, f.op == "array_contains"))
            elif f.op in ("in", "array_contains_any") and split is None:
                keys = [_index_key(v) for v in f.value]
                if keys and all(k is not None for k in keys):
                    split = [(f.field, k, f.op == "array_contains_any") for k in dict.fromkeys(keys)]
        if not fixed and not split:
            return None
        views = self._views.setdefault(collection_path, {})
        chosen = []
        for extra in split or [None]:
            conditions = tuple(fixed) + ((extra,) if extra else ())
            view = views.get((conditions, orders))
            if view is None:
                view = views[(conditions, orders)] = _OrderedView(conditions, orders)
                field, key, elements = conditions[0]
                docs = self._collections.get(collection_path, {})
                for doc_id in sorted(self._index_for(collection_path, field, elements).get(key, ())):  # (a set)
                    view.update(doc_id, docs[doc_id].data)
                routes = self._view_routes.setdefault(collection_path, {}).setdefault((field, elements), {})
                routes.setdefault(key, []).append(view)
            chosen.append(view)
        return chosen

    def _index_for(self, collection_path: str, field: str, elements: bool) -> dict[Any, set[str]]:
        indexes = self._indexes.setdefault(collection_path, {})
        index = indexes.get((field, elements))
        if index is None:
            index = indexes[(field, elements)] = {}
            for doc_id, stored in self._collections.get(collection_path, {}).items():
                _index(index, field, elements, doc_id, stored.data)
        return index

    def _children(self, collection_path: str) -> list[tuple[str, _Stored]]:
        docs = self._collections.get(collection_path, {})
        return [(f"{collection_path}/{doc_id}", docs[doc_id]) for doc_id in sorted(docs)]

    def _stored(self, path: str) -> _Stored | None:
        collection, doc_id = path.rsplit("/", 1)
        return self._collections.get(collection, {}).get(doc_id)

    def _store(self, path: str, stored: _Stored | None) -> None:
        collection, doc_id = path.rsplit("/", 1)
        current = self._collections.get(collection, {}).get(doc_id)
        if current is not stored:
            self.changes += 1
            if self.observer is not None:
                self.observer.changed(path, current.data if current else None, stored.data if stored else None)
            for (field, elements), index in self._indexes.get(collection, {}).items():
                _unindex(index, field, elements, doc_id, current.data if current else None)
                _index(index, field, elements, doc_id, stored.data if stored else None)
            for (field, elements), by_key in self._view_routes.get(collection, {}).items():
                old_keys = _index_values(current.data if current else None, field, elements)
                new_keys = _index_values(stored.data if stored else None, field, elements)
                for key in dict.fromkeys(old_keys + new_keys):
                    for view in by_key.get(key, ()):
                        view.update(doc_id, stored.data if stored else None)
        if stored is not None:
            self._collections.setdefault(collection, {})[doc_id] = stored
        elif doc_id in self._collections.get(collection, {}):
            del self._collections[collection][doc_id]

    # ---- writes
    def batch(self) -> "MemoryBatch":
        return MemoryBatch(self)

    def transaction(self, max_attempts: int = 5, read_only: bool = False) -> "MemoryTransaction":
        return MemoryTransaction(self, max_attempts, read_only)

    @staticmethod
    def write_option(**kwargs: Any):
        if len(kwargs) != 1:
            raise TypeError("Exactly one option must be provided")
        (name, value), = kwargs.items()
        if name == "last_update_time":
            return LastUpdateOption(value)
        if name == "exists":
            return ExistsOption(bool(value))
        raise TypeError(f"{name} is an invalid write option")

    def _time(self) -> datetime:
        """Strictly later than the last commit, even under a frozen clock."""
        raw = self._now()
        if raw is self._time_raw or (raw == self._time_raw and type(raw) is type(self._time_raw)):
            now = self._time_encoded  # every read of one instant: encoded once
        else:
            now = self._time_encoded = _encode(raw)
            self._time_raw = raw
        last = self._last_commit
        if last is not None and now <= last:
            after = self._after_last
            if after is None or after[0] is not last:  # every read after one commit at its instant: made once
                after = self._after_last = (last, _encode(last + timedelta(microseconds=1)))
            now = after[1]
        return now

    def _commit(self, writes: list[_Write], reads: dict[str, datetime | None] | None = None) -> list[WriteResult]:
        if len(writes) > MAX_WRITES_PER_COMMIT:
            raise InvalidArgument(f"maximum {MAX_WRITES_PER_COMMIT} writes allowed per request")
        with self._lock:
            if self.observer is not None:  # a precondition reads what it checks, whether the commit goes on or not
                for path in {*(reads or ()), *(w.path for w in writes)}:
                    self.observer.read_document(path)
            for path, seen in (reads or {}).items():
                stored = self._stored(path)
                if (stored.update_time if stored else None) != seen:
                    raise Aborted(f"transaction aborted: {path} changed since it was read")
            commit_time = self._time()
            working: dict[str, _Stored | None] = {}
            results = []
            for write in writes:
                current = working[write.path] if write.path in working else self._stored(write.path)
                after = _apply(write, current, commit_time)
                if after is not None and after is not current:  # refused before anything of the commit is stored
                    _sized(write, current, after)
                working[write.path] = after
                results.append(WriteResult(after.update_time if after else None))
            for path, after in working.items():
                self._store(path, after)
            for write in writes:
                if write.kind == "delete":
                    self.billed.deletes += 1
                else:
                    self.billed.writes += 1
            self._last_commit = commit_time
            return results

    def _auto_id(self) -> str:
        return "".join(self._rng.choice(string.ascii_letters + string.digits) for _ in range(20))


def _split(path: tuple[str, ...]) -> list[str]:
    if len(path) <= 2 and all(p and "/" not in p for p in path):
        return list(path)  # collection(name), collection(name).document(id): most references
    parts = [p for segment in path for p in segment.split("/")]
    if any(not p for p in parts):
        raise ValueError(f"a path has an empty part: {path!r}")
    return parts


class _Named:
    """What document and collection references share: a database and a path."""

    _client: MemoryFirestore
    _parts: tuple[str, ...]

    @property
    def id(self) -> str:
        return self._parts[-1]

    @functools.cached_property
    def path(self) -> str:  # (a reference's parts never change: joined once, on the first ask)
        return "/".join(self._parts)


class MemoryDocument(_Named):
    def __init__(self, db: MemoryFirestore, parts: tuple[str, ...]):
        self._client, self._parts = db, parts

    @property
    def parent(self) -> "MemoryCollection":
        return MemoryCollection(self._client, self._parts[:-1])

    def collection(self, name: str) -> "MemoryCollection":
        return self._client.collection(*self._parts, name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MemoryDocument) and other._client is self._client and other._parts == self._parts

    def __hash__(self) -> int:
        return hash(self._parts)

    def __repr__(self) -> str:
        return f"MemoryDocument({self.path!r})"

    def get(self, field_paths=None, transaction: "MemoryTransaction | None" = None, **_: Any) -> "MemorySnapshot":
        with self._client._lock:
            snap = self._client._snapshot(self)
        if transaction is not None:
            transaction._read(snap)
        return snap

    def create(self, document_data: dict, **_: Any) -> WriteResult:
        return self._client._commit([_Write("create", self.path, _checked(document_data, "create"))])[0]

    def set(self, document_data: dict, merge: bool = False, **_: Any) -> WriteResult:
        return self._client._commit([_set_write(self.path, document_data, merge)])[0]

    def update(self, field_updates: dict, option: Any = None, **_: Any) -> WriteResult:
        return self._client._commit([_update_write(self.path, field_updates, option)])[0]

    def delete(self, option: Any = None, **_: Any) -> datetime:
        self._client._commit([_Write("delete", self.path, option=option)])
        assert self._client._last_commit is not None
        return self._client._last_commit


def _checked(data: dict, request: str) -> dict:
    if not isinstance(data, dict):
        raise TypeError(f"a document is a dict, not {type(data).__name__}")
    _no_delete_field(data, request)
    return data


def _set_write(path: str, data: dict, merge: bool) -> _Write:
    if not isinstance(merge, bool):
        raise NotImplementedError("set(merge=[field paths]) is not used by tpuq and not modelled")
    return _Write("set", path, data if merge else _checked(data, "set without merge"), merge=merge)


def _update_write(path: str, fields: dict, option: Any) -> _Write:
    if not fields:
        raise ValueError("Cannot update with an empty document.")
    if isinstance(option, ExistsOption):  # update requires the document already; the client refuses this option
        raise ValueError("you must not pass an explicit write option to update.")
    return _Write("update", path, dict(fields), option=option)


@dataclass
class MemorySnapshot:
    reference: MemoryDocument
    _data: dict | None
    create_time: datetime | None
    update_time: datetime | None
    read_time: datetime
    _containers: tuple[tuple[str, bool], ...] | None = None  # the stored document's `_Stored.containers`, if known

    @property
    def id(self) -> str:
        return self.reference.id

    @property
    def exists(self) -> bool:
        return self._data is not None

    def to_dict(self) -> dict | None:
        # The stored map is shared (a write stores a new one): every caller gets a copy. Known containers: the
        # map copied at once, then only the fields that hold maps or arrays copied in depth.
        if self._data is None or self._containers is None:
            return _copy(self._data)
        copied = self._data.copy()
        for key, flat in self._containers:
            copied[key] = copied[key].copy() if flat else _copy(copied[key])
        return copied

    def get(self, field_path: str) -> Any:
        if self._data is None:
            return None
        value = _lookup(self._data, field_path)
        if value is _MISSING:
            raise KeyError(f"No field {field_path!r} in document {self.reference.path}")
        return _copy(value)


# ------------------------------------------------------------------ batches and transactions


class MemoryBatch:
    """`db.batch()`: writes collected, then committed all or nothing."""

    def __init__(self, db: MemoryFirestore):
        self._client = db
        self._writes: list[_Write] = []

    def _add(self, write: _Write) -> None:
        self._writes.append(write)

    def create(self, reference: MemoryDocument, document_data: dict) -> None:
        self._add(_Write("create", reference.path, _checked(document_data, "create")))

    def set(self, reference: MemoryDocument, document_data: dict, merge: bool = False) -> None:
        self._add(_set_write(reference.path, document_data, merge))

    def update(self, reference: MemoryDocument, field_updates: dict, option: Any = None) -> None:
        self._add(_update_write(reference.path, field_updates, option))

    def delete(self, reference: MemoryDocument, option: Any = None) -> None:
        self._add(_Write("delete", reference.path, option=option))

    def __len__(self) -> int:
        return len(self._writes)

    def commit(self, **_: Any) -> list[WriteResult]:
        writes, self._writes = self._writes, []
        return self._client._commit(writes)


class MemoryTransaction(MemoryBatch):
    """`db.transaction()`, driven by `@firestore.transactional` (which calls `_begin`, `_commit`, `_rollback`).

    Optimistic where Firestore locks: a document read in the transaction and
    changed by someone else before the commit makes the commit raise Aborted,
    which the decorator retries. The outcome is the same serializable one.
    """

    def __init__(self, db: MemoryFirestore, max_attempts: int, read_only: bool):
        super().__init__(db)
        self._max_attempts, self._read_only = max_attempts, read_only
        self._id: bytes | None = None
        self._reads: dict[str, datetime | None] = {}
        self._counter = 0

    @property
    def in_progress(self) -> bool:
        return self._id is not None

    @property
    def id(self) -> bytes | None:
        return self._id

    def _clean_up(self) -> None:
        self._writes, self._reads, self._id = [], {}, None

    def _begin(self, retry_id: bytes | None = None) -> None:
        if self.in_progress:
            raise ValueError("The transaction has already begun.")
        self._counter += 1
        self._id = f"memory-tx-{id(self)}-{self._counter}".encode()

    def _rollback(self) -> None:
        self._clean_up()

    def _commit(self) -> list[WriteResult]:
        if not self.in_progress:
            raise ValueError("The transaction has no transaction ID, so it cannot be committed.")
        writes, reads = self._writes, self._reads
        try:
            return self._client._commit(writes, reads)
        finally:
            self._clean_up()

    def _read(self, snap: MemorySnapshot) -> None:
        if self._writes:
            raise ValueError("Attempted read after write in a transaction.")
        self._reads.setdefault(snap.reference.path, snap.update_time)

    def _add(self, write: _Write) -> None:
        if self._read_only:
            raise ValueError("Cannot perform write operation in read-only transaction.")
        self._writes.append(write)

    def get(self, ref_or_query, **_: Any):
        if isinstance(ref_or_query, MemoryDocument):
            return ref_or_query.get(transaction=self)
        return ref_or_query.stream(transaction=self)

    def get_all(self, references, **_: Any):
        return self._client.get_all(references, transaction=self)

    def commit(self, **_: Any) -> list[WriteResult]:
        raise TypeError("a transaction is committed by @firestore.transactional, not by commit()")


# ------------------------------------------------------------------ queries


@dataclass(frozen=True)
class _Filter:
    field: str
    op: str
    value: Any
    given: Any = field(default=None, compare=False, repr=False)  # the value as the caller passed it (observers)

    def matches(self, data: dict) -> bool:
        actual = _lookup(data, self.field)
        if actual is _MISSING:
            return False  # Firestore never matches a document without the field, whatever the operator
        op, value = self.op, self.value
        if op == "==":
            return _equal(actual, value)
        if op == "!=":
            return actual is not None and not _equal(actual, value)  # null never matches != (nor not-in)
        if op in ("<", "<=", ">", ">="):
            if _type_rank(actual) != _type_rank(value):
                return False
            a, b = _order_key(actual), _order_key(value)
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        if op == "in":
            return any(_equal(actual, v) for v in value)
        if op == "not-in":
            return actual is not None and not any(_equal(actual, v) for v in value)
        if op == "array_contains":
            return isinstance(actual, list) and any(_equal(a, value) for a in actual)
        if op == "array_contains_any":
            return isinstance(actual, list) and any(_equal(a, v) for a in actual for v in value)
        raise ValueError(f"Operator string {op!r} is invalid.")


_OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "not-in", "array_contains", "array_contains_any")
_NULL_FILTERS = {"IS_NULL": "==", "IS_NOT_NULL": "!="}  # the unary filters google's FieldFilter makes of None


class MemoryQuery:
    def __init__(self, collection: "MemoryCollection", filters: tuple[_Filter, ...] = (),
                 orders: tuple[tuple[str, str], ...] = (), limit: int | None = None, offset: int = 0):
        self._parent, self._filters, self._orders, self._limit, self._offset = (
            collection, filters, orders, limit, offset)

    def _copy(self, **changes: Any) -> "MemoryQuery":
        copied = MemoryQuery.__new__(MemoryQuery)  # (every query built is copied once a clause: made directly)
        copied._parent, copied._filters, copied._orders, copied._limit, copied._offset = (
            self._parent, changes.get("filters", self._filters), changes.get("orders", self._orders),
            changes.get("limit", self._limit), changes.get("offset", self._offset))
        return copied

    def where(self, field_path: str | None = None, op_string: str | None = None, value: Any = None, *,
              filter: Any = None) -> "MemoryQuery":
        if filter is not None:
            if field_path is not None or op_string is not None:
                raise ValueError("Can't pass in both the positional arguments and 'filter' at the same time")
            try:
                field_path, op_string, value = filter.field_path, filter.op_string, filter.value
            except AttributeError:
                raise NotImplementedError("only FieldFilter is modelled (tpuq uses no And/Or filters)") from None
            if getattr(op_string, "name", None) in _NULL_FILTERS:  # FieldFilter(f, "==", None) is a unary IS_NULL
                op_string, value = _NULL_FILTERS[op_string.name], None
        if op_string not in _OPS:
            raise ValueError(f"Operator string {op_string!r} is invalid. Valid choices are: {', '.join(_OPS)}.")
        given = value
        if op_string in ("in", "not-in", "array_contains_any"):
            value = list(value)
            if len(value) > _MAX_IN_VALUES:
                raise InvalidArgument(f"'{op_string}' supports up to {_MAX_IN_VALUES} comparison values.")
            value = [_encode(v) for v in value]
        else:
            if value is None and op_string not in ("==", "!="):
                raise ValueError("Null values may only be used with the '==' and '!=' operators.")
            value = _encode(value)
        return self._copy(filters=self._filters + (_Filter(str(field_path), str(op_string), value, given),))

    def order_by(self, field_path: str, direction: str = ASCENDING) -> "MemoryQuery":
        if direction not in (ASCENDING, DESCENDING):
            raise ValueError(f"Invalid direction {direction!r}. Must be one of {ASCENDING!r} or {DESCENDING!r}.")
        return self._copy(orders=self._orders + ((field_path, direction),))

    def limit(self, count: int) -> "MemoryQuery":
        return self._copy(limit=count)

    def offset(self, num_to_skip: int) -> "MemoryQuery":
        return self._copy(offset=num_to_skip)

    def _ordering(self) -> list[tuple[str, str]]:
        orders = list(self._orders)
        for f in self._filters:  # Firestore orders by an inequality's field implicitly
            if f.op in _INEQUALITIES and f.field not in (o for o, _ in orders):
                orders.append((f.field, ASCENDING))
        return orders

    def _results(self, billed: bool = True) -> list[MemorySnapshot]:
        db = self._parent._client
        orders = self._ordering()
        last_direction = orders[-1][1] if orders else ASCENDING
        with db._lock:
            if db.observer is not None:
                db.observer.read_query(self._parent.path, self._filters)
            read_time = db._time()
            filters = self._filters
            views = db._views_for(self._parent.path, filters, tuple(orders)) if self._limit is not None else None
            ranged = None if views is not None else self._lower_bounded(db, filters, orders)
            if views is not None:
                hits = self._first_matches(db, views)
            elif ranged is not None:
                hits = ranged
            else:
                hits = [(doc_id, stored) for doc_id, stored in db._candidates(self._parent.path, filters)
                        if all(f.matches(stored.data) for f in filters)
                        and all(_lookup(stored.data, o) is not _MISSING for o, _ in orders)]
                if last_direction == DESCENDING:  # the candidates come in id order: the last tie-break
                    hits.reverse()
                for field, direction in reversed(orders):  # stable sorts: the first order_by ends up outermost
                    hits.sort(key=lambda hit: _order_key(_lookup(hit[1].data, field)),
                              reverse=direction == DESCENDING)
            if self._limit is not None:
                hits = hits[: self._offset + self._limit]
            if billed:  # the documents an offset skips are billed too
                db.billed.reads += max(1, len(hits))
            hits = hits[self._offset:]
            parts = self._parent._parts
            return [MemorySnapshot(MemoryDocument(db, (*parts, doc_id)), s.data, s.create_time, s.update_time,
                                   read_time, s.containers) for doc_id, s in hits]

    def _lower_bounded(self, db: MemoryFirestore, filters, orders) -> list[tuple[str, "_Stored"]] | None:
        """A query with equality filters and a lower bound (`>`, `>=`) on the field it is ordered by first,
        ascending (`written_at > t`: what changed since), answered from the ordered view as Firestore answers it
        from a composite index: from the bound on, not by scanning every document the equalities match. None:
        not such a query (the caller scans)."""
        if not orders or orders[0][1] != ASCENDING:
            return None
        bounds = [f for f in filters if f.field == orders[0][0] and f.op in (">", ">=")]
        if not bounds or any(f.op in _INEQUALITIES and all(f is not b for b in bounds) for f in filters):
            return None
        views = db._views_for(self._parent.path, filters, tuple(orders))
        if views is None or len(views) != 1:
            return None
        entries = views[0].entries
        start = bisect.bisect_left(entries, (max(_order_key(f.value) for f in bounds),))
        docs = db._collections.get(self._parent.path, {})
        hits = []
        for entry in entries[start:]:
            doc_id = entry[-1].key if isinstance(entry[-1], _Reversed) else entry[-1]
            stored = docs[doc_id]
            if all(f.matches(stored.data) for f in filters):
                hits.append((doc_id, stored))
        return hits

    def _first_matches(self, db: MemoryFirestore, views: list[_OrderedView]) -> list[tuple[str, "_Stored"]]:
        """The first offset + limit documents of the views that match every filter, in the views' order."""
        wanted = self._offset + (self._limit or 0)
        docs = db._collections.get(self._parent.path, {})
        hits = []
        for doc_id in _ids_in_order(views):
            stored = docs[doc_id]
            if all(f.matches(stored.data) for f in self._filters):
                hits.append((doc_id, stored))
                if len(hits) >= wanted:
                    break
        return hits

    def stream(self, transaction: MemoryTransaction | None = None, **_: Any) -> Iterator[MemorySnapshot]:
        for snap in self._results():
            if transaction is not None:
                transaction._read(snap)
            yield snap

    def get(self, transaction: MemoryTransaction | None = None, **_: Any) -> list[MemorySnapshot]:
        return list(self.stream(transaction=transaction))

    def count(self, alias: str | None = None) -> "MemoryCount":
        return MemoryCount(self, alias)


class MemoryCount:
    """`query.count()`: `get()` answers [[AggregationResult]], as the client does."""

    def __init__(self, query: MemoryQuery, alias: str | None):
        self._query, self._alias = query, alias

    def get(self, transaction: MemoryTransaction | None = None, **_: Any) -> list[list[AggregationResult]]:
        snaps = self._query._results(billed=False)
        if transaction is not None:
            for snap in snaps:
                transaction._read(snap)
        db = self._query._parent._client
        db.billed.reads += max(1, -(-len(snaps) // 1000))  # an aggregation bills its index entries, per 1,000
        read_time = snaps[0].read_time if snaps else db._time()
        return [[AggregationResult(self._alias or "field_1", len(snaps), read_time)]]

    def stream(self, **kwargs: Any):
        yield from self.get(**kwargs)


class MemoryCollection(MemoryQuery, _Named):
    def __init__(self, db: MemoryFirestore, parts: tuple[str, ...]):
        self._client, self._parts = db, parts
        super().__init__(self)

    @property
    def parent(self) -> MemoryDocument | None:
        return MemoryDocument(self._client, self._parts[:-1]) if len(self._parts) > 1 else None

    def document(self, document_id: str | None = None) -> MemoryDocument:
        return self._client.document(*self._parts, document_id or self._client._auto_id())

    def add(self, document_data: dict, document_id: str | None = None, **_: Any) -> tuple[datetime, MemoryDocument]:
        ref = self.document(document_id)
        result = ref.create(document_data)
        assert result.update_time is not None
        return result.update_time, ref

    def list_documents(self, **_: Any) -> list[MemoryDocument]:
        with self._client._lock:
            if self._client.observer is not None:
                self._client.observer.read_query(self.path, ())
            children = [self._client.document(path) for path, _ in self._client._children(self.path)]
            self._client.billed.reads += max(1, len(children))
            return children
