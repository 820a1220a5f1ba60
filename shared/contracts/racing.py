"""Core (pure, no I/O): the racing rule, the one answer to "which racers lose once a request is won".

A capacity request races one queued resource per zone (`tpuq.claimer.decide`). Both the claimer (planning the
request) and the janitor (on the ACTIVE fleet event) cancel the losers, whichever sees the win first, and both ask
`race_verdict`; what each then does with a loser is its own (who deletes which state: `tpuq.claimer.model`).

- won: the request's ACTIVE slices cover its `count`. Every racer not ACTIVE loses.
- granted: its held slices (PROVISIONING or ACTIVE) cover `count`, the ACTIVE ones alone do not yet. The racers
  still queued (racing, not held) lose: a second grant would be a slice billed through a PROVISIONING the API will
  not let anyone cancel. Should a granted one fail, the request races again.
- racing: neither; no racer loses.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from tpuq.contracts.documents import QR_STATES_RACING
from tpuq.contracts.documents import QueuedResourceState as Qr

# Slices a request (and an entry) holds: PROVISIONING or ACTIVE. Racers waiting in the queue hold none.
HELD_STATES = frozenset({Qr.PROVISIONING, Qr.ACTIVE})

Racer = TypeVar("Racer", bound=Hashable)


class RaceStage(str, Enum):
    racing = "racing"
    granted = "granted"
    won = "won"


@dataclass(frozen=True)
class RaceVerdict(Generic[Racer]):
    stage: RaceStage
    losers: frozenset[Racer] = frozenset()


def race_verdict(states: Mapping[Racer, str | None], count: int) -> RaceVerdict[Racer]:
    """The stage of one request's race and its losers, from each racer's state (None: not known) and the slices
    the request asks for. A count of 0 is won at once: every racer not ACTIVE loses."""
    if sum(1 for s in states.values() if s == Qr.ACTIVE) >= count:
        return RaceVerdict(RaceStage.won, frozenset(r for r, s in states.items() if s != Qr.ACTIVE))
    if sum(1 for s in states.values() if s in HELD_STATES) >= count:
        return RaceVerdict(RaceStage.granted, frozenset(
            r for r, s in states.items() if s in QR_STATES_RACING and s not in HELD_STATES))
    return RaceVerdict(RaceStage.racing)
