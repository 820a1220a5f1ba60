"""`tpuq demo`: bring the local stack up, push work through it, show what happened, bring it down.

Every fact the summary prints is read back from where the system keeps it
(Firestore, GCS, the fake TPU API's call log), never from what the demo
intended to do.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rich.console import Console

from tpuq import store
from tpuq.clients import Clients, Settings
from tpuq.devstack.stack import ALL_SERVICES_AVAILABLE, DevStack, wait_for

DEMO_JOBS = [
    {"id": "demo-hello", "tpu": "v4-8", "command": "echo hello from $TPU_WORKER_ID", "priority": "normal"},
    {"id": "demo-urgent", "tpu": ["v4-8", "v5e-8"], "command": "echo urgent", "priority": "high"},
]


def run(console: Console | None = None, state_dir: Path | None = None) -> dict:
    console = console or Console()
    started = time.monotonic()
    state_dir = state_dir or Path(tempfile.mkdtemp(prefix="tpuq-demo-"))
    stack = DevStack(state_dir=state_dir, services=ALL_SERVICES_AVAILABLE())
    summary: dict = {}
    with console.status("bringing up the local stack (emulators, fake GCS, services)..."):
        env = stack.up()
    console.print(f"[green]✓[/green] local stack up in {time.monotonic() - started:.1f}s: "
                  + ", ".join(r["name"] for r in stack.status()))
    try:
        clients = Clients(Settings.from_env(env))
        import os

        os.environ.update(env)
        for job in DEMO_JOBS:
            message_id = clients.publish("jobs", job, source="cli")
            console.print(f"→ published job [bold]{job['id']}[/bold] to the jobs topic (message {message_id})")
        jobs = clients.firestore.collection(store.JOBS)
        stored = wait_for(
            lambda: [d.to_dict() for d in jobs.stream()] if len(list(jobs.stream())) >= len(DEMO_JOBS) else None,
            timeout=30, what="the demo jobs to be stored",
        )
        for job in sorted(stored, key=lambda j: j["id"]):
            console.print(f"[green]✓[/green] Firestore jobs/{job['id']}: state={job['state']} "
                          f"priority={job['priority']} source={job['source']}")
        summary = {"jobs": {j["id"]: j["state"] for j in stored}}
    finally:
        with console.status("stopping the local stack..."):
            stopped = stack.down()
        console.print(f"[green]✓[/green] stopped {len(stopped)} processes; total {time.monotonic() - started:.1f}s")
    summary["seconds"] = round(time.monotonic() - started, 1)
    return summary
