"""Core (pure): a job's `slices:` field (issue 37, Multislice), its parsing and its rules.

`slices: N` runs one job on N slices of its type at once, communicating over the data-centre network (Cloud TPU
Multislice). `slices: [4, 2]` is the elastic form: the largest listed count that can be had, in the order given.
Absent, or 1, is today's single slice. The stored form is what the user wrote, normalised: absent for one slice, an
int for one count, a descending list for the elastic form; `slice_counts(value)` reads any of them as a tuple.

The rules, each refusal naming the field:
- counts are whole numbers from 1 to MAX_SLICES; an elastic list descends strictly (no repeats), and only its last
  count may be 1 (the job then runs on one slice when no more can be had);
- one TPU type: "each slice in a multislice request is of the same accelerator type"
  (https://cloud.google.com/tpu/docs/multislice-introduction, "Concepts"), and a queued resource's
  `multisliceParams` repeats one node spec `nodeCount` times
  (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources, MultisliceParams). A list
  of types could mean "N slices of one of these", but the job's own code (its mesh, its batch size) depends on the
  type, and racing type x count would make the elastic form two-dimensional: refused until someone needs it.
  `tpu: any` is refused for the same reason;
- v4 or later: the page above defines the accelerator type of a multislice as "TPU type (v4 or later)";
- a `single_slot` family (tpuq.contracts.tputypes.Family.single_slot, v6e) is allowed: its gang is one queued
  resource, raced alone like any request of that type (one racer in the whole fleet: tpuq.claimer.decide);
- not with `tpu_name`: one named node is one slice.
"""

from __future__ import annotations

from typing import Any

from tpuq.contracts.tputypes import UnknownAcceleratorType, family, parse_accelerator_type

# tpuq's own bound, not Google's (the API only says nodeCount "needs to be > 1"): a grant's zone seldom holds more
# than a few dozen slices of one type, and a typo such as 400 should be caught at submit, not wait for ever.
MAX_SLICES = 64

def parse_slices(value: Any) -> int | list[int] | None:
    """The stored form of `slices:`: None (one slice), an int >= 2, or an elastic descending list. Raises ValueError
    saying why (pydantic prefixes the field: `jobs[0].slices: ...`)."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError("an empty list: give a number of slices, e.g. 4, or counts to try, e.g. [4, 2]")
        counts = [_count(v, f"[{i}]") for i, v in enumerate(value)]
        for i, (earlier, later) in enumerate(zip(counts, counts[1:])):
            if later == earlier:
                raise ValueError(f"[{i + 1}]: {later} is listed twice; the counts to try are listed once each, largest "
                                 "first, e.g. [4, 2]")
            if later > earlier:
                raise ValueError(f"[{i + 1}]: {later} after {earlier}: list the counts to try largest first, e.g. "
                                 f"{sorted(counts, reverse=True)}")
        if 1 in counts[:-1]:
            raise ValueError("1 can only be the last count tried")
        if len(counts) == 1:
            return None if counts[0] == 1 else counts[0]
        return counts
    count = _count(value, "")
    return None if count == 1 else count


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where + ': ' if where else ''}{value!r} is not a whole number of slices")
    if value < 1:
        raise ValueError(f"{where + ': ' if where else ''}{value} slices: a job runs on at least 1 slice")
    if value > MAX_SLICES:
        raise ValueError(f"{where + ': ' if where else ''}{value} slices: tpuq runs a job on at most {MAX_SLICES}")
    return value


def slice_counts(stored: int | list[int] | None) -> tuple[int, ...]:
    """The counts to try, largest first: (1,) for a single-slice job (stored: absent), (4,) or (4, 2)."""
    if stored is None:
        return (1,)
    if isinstance(stored, int):
        return (stored,)
    return tuple(stored)


def is_multislice(stored: int | list[int] | None) -> bool:
    return slice_counts(stored)[0] > 1


def refuse_with(stored: int | list[int] | None, types: list[str], any_type: bool, tpu_name: str | None) -> None:
    """The rules that tie `slices` to the job's other fields; raises ValueError naming `slices` and the reason."""
    if not is_multislice(stored):
        return
    shown = f"slices: {stored}"
    if tpu_name is not None:
        raise ValueError(f"{shown}: tpu_name names one node, which is one slice; give one or the other")
    if any_type:
        raise ValueError(f"{shown}: every slice of a multislice job is of one TPU type (Cloud TPU Multislice); "
                         "name it instead of tpu: any")
    if len(types) != 1:
        raise ValueError(f"{shown}: every slice of a multislice job is of one TPU type (Cloud TPU Multislice); "
                         f"name one of {', '.join(types)}, not a list")
    try:
        row = family(parse_accelerator_type(types[0]).family)
    except (UnknownAcceleratorType, KeyError):
        return  # the `tpu` field says what is wrong with the type
    if not row.multislice:
        raise ValueError(f"{shown}: Cloud TPU Multislice needs TPU v4 or later, not {types[0]}")

