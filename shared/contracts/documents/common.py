"""What every document module shares: node names, stored times, and the typed views' machinery."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from datetime import datetime
from enum import Enum, StrEnum
from functools import cache
from typing import Any, ClassVar

from tpuq.contracts.errors import Permanent


def short_node_name(name: str) -> str:
    """`projects/p/locations/z/nodes/my-tpu` -> `my-tpu`; a short name passes through.

    The id of a node's `tpus/{node}` document, and how jobs name a TPU (the way a
    user writes it); full and short names are compared by this form. Queued
    resources are shortened the same way (`.../queuedResources/ID` -> `ID`).
    """
    return name.rsplit("/", 1)[-1]



def parse_timestamp(value: Any) -> datetime | None:
    """An RFC 3339 time as Pub/Sub and the workers' status objects write it ("2026-12-01T15:00:00.123456Z"), or a
    stored datetime as is; None when absent or not a time."""
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


class _View:
    """What the job and attempt views share: their declared field names, and partial writes checked against them."""

    COLLECTION: ClassVar[str]

    @classmethod
    def field_names(cls) -> frozenset[str]:
        return _declared(cls)[0]

    @classmethod
    def field(cls, name: str, *nested: str) -> str:
        """A declared field's name (for a query), or a path into a map field: `field("capacity_request", "id")`."""
        if name not in _declared(cls)[0]:
            raise AttributeError(f"{cls.COLLECTION} documents have no field {name!r}")
        return ".".join((name, *nested)) if nested else name

    @classmethod
    def fields(cls, **values: Any) -> dict[str, Any]:
        """The fields a partial write (update, merge, create) stores: exactly those given, enum members as their
        values. A name the view does not declare is a bug in the writer: TypeError."""
        unknown = sorted(set(values) - cls.field_names())
        if unknown:
            raise TypeError(f"{cls.COLLECTION} documents have no field {', '.join(map(repr, unknown))}")
        return {k: v.value if isinstance(v, Enum) else v for k, v in values.items()}

    @classmethod
    def _from_stored(cls, doc: Mapping[str, Any], **known: Any):
        """The view of `doc`: the `known` fields as given, every other declared field as stored, or its default
        when the document lacks it (or stores null). Fields the view does not declare are ignored."""
        values = dict(known)
        for name, as_tuple in _declared(cls)[1]:
            value = doc.get(name)
            if value is not None and name not in known:
                values[name] = tuple(value) if as_tuple else value
        return cls(**values)


@cache
def _declared(cls: type) -> tuple[frozenset[str], tuple[tuple[str, bool], ...]]:
    """A view's field names, and for each whether it is stored as a list but viewed as a tuple (read once)."""
    declared = fields(cls)
    return frozenset(f.name for f in declared), tuple((f.name, isinstance(f.default, tuple)) for f in declared)


def _state(enum: type[StrEnum], doc: Mapping[str, Any], where: str) -> Any:
    value = doc.get("state")
    try:
        return enum(value)
    except ValueError:
        raise Permanent(f"{where}: state {value!r} is not one of {', '.join(m.value for m in enum)}",
                        field="state") from None

