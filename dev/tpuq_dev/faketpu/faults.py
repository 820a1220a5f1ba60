"""Random, seeded faults on the fake's REST API (the chaos soak's Cloud TPU weather), around the handlers.

A layer of its own: before a REST call reaches its handler, a seeded random source decides its weather:

- **unavailable** (rate `unavailable`): answered at once with HTTP 503 and the body Google's front end sends
  for a backend that is down, `{"error": {"code": 503, "message": "The service is currently unavailable.",
  "status": "UNAVAILABLE"}}` (as reported for googleapis.com APIs in the field; the legacy
  `errors[{reason: backendError}]` list only appears on discovery-era APIs, not on Cloud TPU's). Nothing is done.
- **timeout** (rate `timeout`): the call hangs `hang_seconds`, then is answered 504 DEADLINE_EXCEEDED
  `Deadline expired before operation could complete.` (a client with a shorter deadline gives up first). Half of
  them, at random, are carried out before the hang: the work is done, only the answer is lost, as with a real
  timeout, so a retried create must find its own request (requestId, AlreadyExists).
- **latency spike** (rate `spike`): the call waits up to `spike_max_seconds` (uniform), then runs normally.

Control calls (`/_fake/...`) are never touched. The weather is set and read with `POST /_fake/chaos` (the fields
of `ChaosWeather`; `{}` turns it off) and `GET /_fake/chaos` (`{"weather": ..., "injected": {kind: count}}`),
or `FakeTpuControl.set_chaos` / `chaos`. Injected answers are in the call log like any other, with their status.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable

from flask import Flask, Response, g, request

from tpuq_dev.capacitymodel.errors import ApiError

UNAVAILABLE_MESSAGE = "The service is currently unavailable."
DEADLINE_MESSAGE = "Deadline expired before operation could complete."


@dataclass(frozen=True)
class ChaosWeather:
    seed: int = 0
    unavailable: float = 0.0  # share of calls answered 503 UNAVAILABLE
    timeout: float = 0.0  # share of calls that hang, then answer 504 DEADLINE_EXCEEDED
    hang_seconds: float = 20.0
    spike: float = 0.0  # share of calls delayed by up to spike_max_seconds
    spike_max_seconds: float = 5.0

    @classmethod
    def parse(cls, body: dict[str, Any]) -> "ChaosWeather":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(body) - known)
        if unknown:
            raise ValueError(f"unknown chaos field {unknown[0]!r}; expected some of {', '.join(sorted(known))}")
        try:
            weather = cls(**{k: (int(v) if k == "seed" else float(v)) for k, v in body.items()})
        except (TypeError, ValueError):
            raise ValueError("chaos fields must be numbers") from None
        for name in ("unavailable", "timeout", "spike"):
            if not 0.0 <= getattr(weather, name) <= 1.0:
                raise ValueError(f"chaos field {name!r} must be a share between 0 and 1")
        if weather.unavailable + weather.timeout > 1.0:
            raise ValueError("chaos shares 'unavailable' + 'timeout' must not pass 1")
        return weather


class FaultLayer:
    """The weather now, its random source and what it injected. Thread-safe."""

    def __init__(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self._lock = threading.Lock()
        self._sleep = sleep
        self.set(ChaosWeather())

    def set(self, weather: ChaosWeather) -> None:
        with self._lock:
            self.weather = weather
            self._rng = random.Random(weather.seed)
            self.injected: Counter[str] = Counter()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"weather": asdict(self.weather), "injected": dict(self.injected)}

    def draw(self) -> tuple[str | None, float]:
        """(fault kind or None, seconds to wait first) for one call: 'unavailable' | 'timeout_before' |
        'timeout_after'; the wait is a spike's, or a timeout's hang."""
        with self._lock:
            w, rng = self.weather, self._rng
            roll, delay = rng.random(), 0.0
            if rng.random() < w.spike:
                delay = rng.uniform(0.0, w.spike_max_seconds)
                self.injected["latency_spike"] += 1
            if roll < w.unavailable:
                self.injected["unavailable"] += 1
                return "unavailable", delay
            if roll < w.unavailable + w.timeout:
                self.injected["timeout"] += 1
                return ("timeout_before" if rng.random() < 0.5 else "timeout_after"), w.hang_seconds
            return None, delay

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._sleep(seconds)


def _error(status: str, message: str) -> Response:
    err = ApiError(status, message)
    body = err.to_json()
    body["error"].pop("details", None)  # Google's front end sends none with these two
    return Response(json.dumps(body), status=err.http_status, mimetype="application/json")


def add_fault_layer(app: Flask, layer: FaultLayer) -> None:
    """Hook `layer` around every REST call of `app` and add its control routes. Call it after the app's call-log
    hook is registered: Flask runs after-request hooks last-registered first, so the log records the answer the
    client got (a lost answer's 504, not the handler's 200)."""

    @app.before_request
    def _weather():
        if request.path.startswith("/_fake/"):
            return None
        kind, wait = layer.draw()
        if kind == "unavailable":
            layer.sleep(wait)
            return _error("UNAVAILABLE", UNAVAILABLE_MESSAGE)
        layer.sleep(wait if kind != "timeout_after" else 0.0)
        if kind == "timeout_before":
            return _error("DEADLINE_EXCEEDED", DEADLINE_MESSAGE)
        g.chaos_hang_after = wait if kind == "timeout_after" else 0.0
        return None

    @app.after_request
    def _lost_answer(response: Response):
        hang = g.pop("chaos_hang_after", 0.0)
        if not hang:
            return response
        layer.sleep(hang)
        return _error("DEADLINE_EXCEEDED", DEADLINE_MESSAGE)

    @app.get("/_fake/chaos")
    def _chaos_get():
        return Response(json.dumps(layer.snapshot()), mimetype="application/json")

    @app.post("/_fake/chaos")
    def _chaos_set():
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            body = {}
        try:
            layer.set(ChaosWeather.parse(body))
        except ValueError as e:
            raise ApiError("INVALID_ARGUMENT", str(e)) from None
        return Response(json.dumps(layer.snapshot()), mimetype="application/json")
