"""Handlers that wait without holding the world (the claimer's fast watch sleeps between its re-reads).

In production a service's wait holds only its own request: the other services, the users and the cloud go on.
`Waits.run` calls a handler in a greenlet (with the simulate extra) or else a thread of its own; when the handler
sleeps (`Waits.sleep`), the loop gets control back and runs the events due meanwhile, at their own times, and the
handler goes on at its wake time, as one more event. Exactly one side runs at a time (each hands over to the other
and waits), so a run stays a function of its inputs and seed, and greenlets and threads give the same run. Before this, a wait moved the clock inside the event (`EventLoop.advance_within_event`): every
event due meanwhile then ran at its end, all at once, so jobs submitted during a fast watch reached the scheduler
late and, with the bus's random latency, out of order (tests/e2e/test_simulate_fidelity.py found it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .events import EventLoop

try:  # the simulate extra's: a switch between two greenlets costs a tenth of a handover between two threads
    import greenlet
except ImportError:  # pragma: no cover - a plain install: threads, same order of events, same results
    greenlet = None


class Waits:
    def __init__(self, loop: EventLoop, use_greenlets: bool = greenlet is not None) -> None:
        self.loop = loop
        self.use_greenlets = use_greenlets
        self._local = threading.local()  # the task a thread runs, in that thread

    def run(self, fn: Callable[[], Any], then: Callable[[Any], None]) -> None:
        """Call `fn()` and, once it has returned (now, or after its waits), `then(its result)`."""
        (_GreenletTask if self.use_greenlets else _Task)(self, fn, then).start()

    def _task(self) -> "_Task | _GreenletTask | None":
        if self.use_greenlets:
            return getattr(greenlet.getcurrent(), "sim_task", None)
        return getattr(self._local, "task", None)

    def sleep(self, seconds: float) -> None:
        """A handler's wait: inside `run`, the loop goes on meanwhile; elsewhere, the event takes that long."""
        task = self._task()
        if task is None:
            self.loop.advance_within_event(seconds)
            return
        task.wait_until(self.loop.now() + max(0.0, seconds))


class _TaskBase:
    """What both kinds of task share: the handler, its answer, and handing the answer on once it is done.
    A subclass gives `_hand_over()` (from the loop to the task, until the task waits or ends)."""

    def __init__(self, waits: Waits, fn: Callable[[], Any], then: Callable[[Any], None]) -> None:
        self.waits, self.fn, self.then = waits, fn, then
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None

    def _hand_over(self) -> None:
        raise NotImplementedError

    def _run_handler(self) -> None:  # on the task's side
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001 - handed to the loop's side, raised there
            self.error = e
        self.done = True

    def start(self) -> None:
        self._hand_over()
        self._after_turn()

    def _resume(self) -> None:  # an event of the loop
        self._hand_over()
        self._after_turn()

    def _after_turn(self) -> None:
        if not self.done:
            return
        if self.error is not None:
            raise self.error
        self.then(self.result)


class _GreenletTask(_TaskBase):
    """A task as a greenlet in the loop's thread: `wait_until` switches back to the loop, `_resume` switches in."""

    def __init__(self, waits: Waits, fn: Callable[[], Any], then: Callable[[Any], None]) -> None:
        super().__init__(waits, fn, then)
        self._loop_side = greenlet.getcurrent()
        self._greenlet = greenlet.greenlet(self._run_handler, parent=self._loop_side)
        self._greenlet.sim_task = self

    def _hand_over(self) -> None:
        self._greenlet.switch()

    def wait_until(self, when: float) -> None:  # in the task's greenlet
        self.waits.loop.at(when, self._resume)
        self._loop_side.switch()


class _Task(_TaskBase):
    """A task in a thread of its own; two semaphores hand the turn back and forth."""

    def __init__(self, waits: Waits, fn: Callable[[], Any], then: Callable[[Any], None]) -> None:
        super().__init__(waits, fn, then)
        self._go = threading.Semaphore(0)  # the task's turn
        self._back = threading.Semaphore(0)  # the loop's turn
        self._thread: threading.Thread | None = None

    def _hand_over(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, daemon=True, name="sim-handler")
            self._thread.start()
        else:
            self._go.release()
        self._back.acquire()

    def _main(self) -> None:
        self.waits._local.task = self
        self._run_handler()
        self._back.release()

    def wait_until(self, when: float) -> None:  # in the task's thread
        self.waits.loop.at(when, self._resume)
        self._back.release()
        self._go.acquire()
