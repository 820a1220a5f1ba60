"""Fast reads of google-cloud-tpu's typed resources (proto-plus messages) through the protobuf they wrap.

The janitor and the claimer's watch read every resource of a fleet on each pass and ask several questions of
each. proto-plus converts on every field access (some 30 µs each); the protobuf message behind it answers the
same question in well under a microsecond. Only reads go this way: nothing here changes a message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def raw_message(obj: Any) -> Any:
    """The protobuf message behind a proto-plus one, else None (a REST dict, a test's stand-in)."""
    cls = type(obj)
    if isinstance(obj, Mapping) or not hasattr(cls, "meta") or not hasattr(cls, "pb"):
        return None
    try:
        return cls.pb(obj)
    except TypeError:
        return None


def has_field(raw: Any, name: str) -> bool:
    """Whether the message's type declares the field (not whether it is set)."""
    return name in raw.DESCRIPTOR.fields_by_name


def state_name(raw: Any) -> str:
    """The enum name of `state`: a Node's `state`, or a QueuedResource's `state.state`; a number this
    google-cloud-tpu does not know (a state the API added since) as its digits, as proto-plus gives it."""
    field = raw.DESCRIPTOR.fields_by_name["state"]
    if field.message_type is not None:  # a QueuedResource's QueuedResourceState message
        raw = raw.state
        field = raw.DESCRIPTOR.fields_by_name["state"]
    value = field.enum_type.values_by_number.get(raw.state)
    return value.name if value is not None else str(raw.state)
