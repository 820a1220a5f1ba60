"""The racing rule both the claimer and the janitor apply (`tpuq.contracts.racing.race_verdict`)."""

from __future__ import annotations

import pytest

from tpuq.contracts.documents import ClaimerQrState as Claimer
from tpuq.contracts.documents import QueuedResourceState as Qr
from tpuq.contracts.racing import RaceStage, race_verdict

EVERY_STATE = [*Qr, Claimer.REQUESTED, Claimer.GONE, None]


def verdict(count: int, **states):
    v = race_verdict(states, count)
    return v.stage, set(v.losers)


def test_a_race_goes_on_until_its_count_is_held():
    assert verdict(1, a=Qr.WAITING_FOR_RESOURCES, b=Qr.ACCEPTED, c=Claimer.REQUESTED) == (RaceStage.racing, set())
    assert verdict(2, a=Qr.ACTIVE, b=Qr.WAITING_FOR_RESOURCES, c=Qr.FAILED) == (RaceStage.racing, set())


def test_once_won_every_racer_not_active_loses():
    stage, losers = verdict(1, win=Qr.ACTIVE, queued=Qr.WAITING_FOR_RESOURCES, accepted=Qr.ACCEPTED,
                            granted=Qr.PROVISIONING, new=Claimer.REQUESTED, dead=Qr.SUSPENDED, failed=Qr.FAILED,
                            unread=None)
    assert stage is RaceStage.won
    assert losers == {"queued", "accepted", "granted", "new", "dead", "failed", "unread"}


def test_winners_beyond_the_count_are_not_losers():
    assert verdict(1, a=Qr.ACTIVE, b=Qr.ACTIVE, c=Qr.ACCEPTED) == (RaceStage.won, {"c"})


def test_once_granted_only_the_racers_still_queued_lose():
    stage, losers = verdict(2, win=Qr.ACTIVE, granted=Qr.PROVISIONING, queued=Qr.WAITING_FOR_RESOURCES,
                            accepted=Qr.ACCEPTED, creating=Qr.CREATING, new=Claimer.REQUESTED, failed=Qr.FAILED,
                            dead=Qr.SUSPENDED)
    assert stage is RaceStage.granted
    assert losers == {"queued", "accepted", "creating", "new"}  # dead ones are not racing; held ones may still win


def test_a_count_of_zero_is_won_at_once():
    assert verdict(0, a=Qr.PROVISIONING, b=Qr.ACCEPTED) == (RaceStage.won, {"a", "b"})
    assert verdict(0) == (RaceStage.won, set())


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("state", EVERY_STATE)
def test_a_winner_never_loses_and_a_held_slice_loses_only_to_a_win(state, count):
    states = {"w1": Qr.ACTIVE, "w2": Qr.ACTIVE, "p": Qr.PROVISIONING, "x": state}
    v = race_verdict(states, count)
    assert not {"w1", "w2"} & v.losers and (v.stage is RaceStage.won or "p" not in v.losers)
