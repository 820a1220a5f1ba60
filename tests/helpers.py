"""Small helpers the test packages share: polling with a deadline, the one push-envelope builder, and a terminal
(tmux) for driving the CLI as a person does."""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

ENVELOPES = Path(__file__).resolve().parent / "envelopes"


def load_benchmark(name: str):
    """A script of benchmarks/ (not a package) as a module, for tests that call its functions."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tpuq_benchmark_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> object:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds.

    A poll that raises means "not yet" (a server still starting, an object not yet written).
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - a poll that raises is "not yet"
            last_error = e
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last_error!r})" if last_error else ""))


@lru_cache(maxsize=None)
def _golden(name: str) -> str:
    return (ENVELOPES / name).read_text()


def golden_envelope(name: str) -> dict[str, Any]:
    """A fresh copy of one of the golden envelopes in tests/envelopes/."""
    return json.loads(_golden(name))


def push_envelope(message: BaseModel | dict | bytes, message_id: str, subscription: str,
                  attributes: dict[str, str] | None = None, delivery_attempt: int | None = None) -> dict[str, Any]:
    """A Pub/Sub push body shaped like tests/envelopes/pubsub-push.json, carrying `message`.

    `subscription` is a short name (`scheduler-jobs`) or a full path. Without `delivery_attempt` the
    envelope has none, as the emulator sends it.
    """
    if isinstance(message, BaseModel):
        data = message.model_dump_json(exclude_none=True).encode()
    elif isinstance(message, bytes):
        data = message
    else:
        data = json.dumps(message).encode()
    body = golden_envelope("pubsub-push.json")
    body["message"].update(data=base64.b64encode(data).decode(), messageId=message_id, message_id=message_id,
                           attributes=copy.deepcopy(attributes or {}))
    body["subscription"] = subscription if "/" in subscription else f"projects/tpuq-local/subscriptions/{subscription}"
    if delivery_attempt is None:
        body.pop("deliveryAttempt", None)
    else:
        body["deliveryAttempt"] = delivery_attempt
    return body


def fleets_only_context(fleets: dict):
    """A handler context whose Firestore holds only `fleets/{name}`: name -> a FleetFile, or a raw dict stored as
    the fleet file (one that does not validate, say), for a tick's loop over the fleets. Any other document
    reads as absent."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    docs = {name: {"fleet": f if isinstance(f, dict) else f.model_dump(mode="json")} for name, f in fleets.items()}

    class Fleets:
        def stream(self):
            return iter(SimpleNamespace(id=name, to_dict=lambda doc=doc: doc) for name, doc in docs.items())

        def document(self, _id):  # any other document (fleet_control/, say) does not exist
            return SimpleNamespace(get=lambda: SimpleNamespace(exists=False, to_dict=lambda: None))

    return SimpleNamespace(clients=SimpleNamespace(firestore=SimpleNamespace(collection=lambda _name: Fleets())),
                           now=lambda: datetime.now(timezone.utc))


class Tmux:
    """A tmux server of this test's own (its own socket: never another user's sessions), one 200x50 window."""

    def __init__(self, env: dict[str, str]) -> None:
        self.socket = f"tpuq-test-{uuid.uuid4().hex[:8]}"
        self.env = env
        self.run("new-session", "-d", "-s", "live", "-x", "200", "-y", "50", "bash --norc --noprofile")

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], env=self.env, capture_output=True, text=True,
                              check=True, timeout=30).stdout

    def type(self, line: str) -> None:
        self.run("send-keys", "-t", "live", line, "Enter")

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "live", *keys)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "live")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True, timeout=30)


def worker_rows(screen: str) -> dict[int, list[str]]:
    """The watch view's worker rows: worker number -> the row's words (state, exit, elapsed, last line...)."""
    rows = {}
    for line in screen.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].isdigit() and re.fullmatch(r"[a-z_]+", words[1]):
            rows[int(words[0])] = words[1:]
    return rows


def serve_in_thread(app):
    """A WSGI app on a free local port, served by a daemon thread; the caller shuts the server down."""
    import threading

    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server
