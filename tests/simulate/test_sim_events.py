"""The simulator's event loop: events in time order, and progress a user can watch on a short run too."""

import pytest

from tpuq_dev.simulate.events import EventLoop


@pytest.mark.parametrize("horizon, most_apart", [(43_200.0, 432.0), (30 * 86_400.0, 86_400.0)])
def test_progress_is_reported_through_the_run_not_only_at_its_end(horizon, most_apart):
    loop = EventLoop()
    ran: list[float] = []
    loop.every(60.0, lambda: ran.append(loop.now()))
    told: list[float] = []
    loop.run(horizon, on_progress=told.append)
    assert ran == sorted(ran) and len(ran) == horizon / 60 - 1  # every tick due before the horizon
    assert told[-1] == horizon and len(told) >= 30
    assert max(b - a for a, b in zip([0.0, *told], told)) <= most_apart + 60.0
