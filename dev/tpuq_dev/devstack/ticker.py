"""The local tick source: publishes a Tick to `ticks` every PERIOD seconds (Cloud Scheduler's job in production)."""

from __future__ import annotations

import argparse
import signal
import threading
from datetime import datetime, timezone

from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings
from tpuq.contracts.messages import Tick


def run(period: float, clients: Clients, stop: threading.Event) -> None:
    seq = 0
    while not stop.wait(period):
        seq += 1
        try:
            clients.publish("ticks", Tick(at=datetime.now(timezone.utc), seq=seq, source="local-ticker"))
        except Exception as e:  # noqa: BLE001 - a missed tick is harmless; the next one comes
            print(f"tick {seq} not published: {e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--period", type=float, default=5.0)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run(args.period, Clients(Settings.from_env()), stop)


if __name__ == "__main__":
    main()
