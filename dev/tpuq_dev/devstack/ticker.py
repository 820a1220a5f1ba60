"""The local tick source: publishes a Tick to `ticks` every PERIOD seconds (Cloud Scheduler's job in production),
where the janitor routes it (`tpuq.runtime.tickdue`). A stack run without the janitor has no router: its ticker
publishes each tick on the running services' own tick topics instead (`--topic`, repeated), every tick to each."""

from __future__ import annotations

import argparse
import signal
import threading
from datetime import datetime, timezone

from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.contracts.messages import Tick


def run(period: float, clients: Clients, stop: threading.Event, topics: tuple[str, ...] = ("ticks",)) -> None:
    seq = 0
    while not stop.wait(period):
        seq += 1
        tick = Tick(at=datetime.now(timezone.utc), seq=seq, source="local-ticker")
        for topic in topics:
            try:
                clients.publish(topic, tick)
            except Exception as e:  # noqa: BLE001 - a missed tick is harmless; the next one comes
                print(f"tick {seq} not published on {topic}: {e}", flush=True)


def topics_for(services: tuple[str, ...]) -> tuple[str, ...]:
    """Where a stack running `services` publishes its ticks: the clock's topic when the janitor (the router) runs,
    else each running service's own."""
    from tpuq.contracts import topology

    if "janitor" in services:
        return (topology.CLOCK_TOPIC,)
    return tuple(topology.tick_topic(s) for s in services)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--period", type=float, default=5.0)
    parser.add_argument("--topic", action="append", help="publish on this topic (repeat; default: ticks)")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run(args.period, Clients(Settings.from_env()), stop, tuple(args.topic or ("ticks",)))


if __name__ == "__main__":
    main()
