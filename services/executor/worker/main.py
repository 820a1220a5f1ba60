"""The command line: one subcommand per call, one JSON object on stdout."""

from __future__ import annotations

import json
import os
import sys

from .control import cancel, launch, status
from .processes import CONTROL_LOCK_WAIT_SECONDS, control_lock
from .supervision import supervise
from .workspace import prepare


def emit(result: dict) -> int:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result.get("ok") else 1


# Each subcommand's options (all take a value) and those it requires. Parsed by hand, not by argparse: this runs
# once or twice before every job starts, and argparse's import and parsers cost ~15 ms of a ~50 ms run.
OPTIONS = {
    "prepare": ("--lock-wait",),
    "start": ("--attempt-id", "--lock-wait"),  # prepare, then launch: one process for a one-worker slice
    "launch": ("--attempt-id", "--lock-wait"),
    "cancel": ("--attempt-id", "--reason", "--grace"),
    "status": ("--attempt-id",),
    "supervise": (),
}
REQUIRED = {"start": ("--attempt-id",), "launch": ("--attempt-id",), "cancel": ("--attempt-id",)}
USAGE = "usage: tpuq-supervisor [--home HOME] {" + ",".join(OPTIONS) + "} [--option VALUE ...]"


class UsageError(Exception):
    pass


def parse(argv: list[str]) -> tuple[str, str, dict[str, str]]:
    """(home, subcommand, {option: value}) from `[--home HOME] SUBCOMMAND [--option VALUE | --option=VALUE ...]`."""
    home, command, given, rest = os.path.expanduser("~"), None, {}, list(argv)
    while rest:
        word = rest.pop(0)
        name, eq, value = word.partition("=")
        if command is None and name == "--home" or command is not None and name in OPTIONS[command]:
            if not eq:
                if not rest:
                    raise UsageError(f"{name} needs a value")
                value = rest.pop(0)
            if name == "--home":
                home = value
            else:
                given[name] = value
        elif command is None and word in OPTIONS:
            command = word
        else:
            raise UsageError(f"unexpected argument {word!r}")
    if command is None:
        raise UsageError("a subcommand is required")
    missing = [name for name in REQUIRED.get(command, ()) if name not in given]
    if missing:
        raise UsageError(f"{command} requires {', '.join(missing)}")
    return os.path.abspath(home), command, given


def main(argv: list[str] | None = None) -> int:
    try:
        home, command, given = parse(sys.argv[1:] if argv is None else argv)
        lock_wait = float(given.get("--lock-wait", CONTROL_LOCK_WAIT_SECONDS))
        grace = float(given["--grace"]) if "--grace" in given else None
    except (UsageError, ValueError) as e:
        sys.stderr.write(f"{USAGE}\ntpuq-supervisor: error: {e}\n")
        return 2
    attempt_id = given.get("--attempt-id")

    if command in ("prepare", "launch", "start"):
        spec_text = sys.stdin.read() if command in ("prepare", "start") else ""
        lock = control_lock(home, lock_wait)
        if lock is None:
            return emit({"ok": False, "kind": "infra", "reason": "another prepare or launch holds this worker"})
        try:
            if command == "prepare":
                return emit(prepare(home, spec_text))
            if command == "launch":
                return emit(launch(home, attempt_id, os.path.abspath(__file__)))
            # start: prepare, then launch, in one process (a one-worker slice has no other worker to wait for)
            prepared = prepare(home, spec_text)
            launched = launch(home, attempt_id, os.path.abspath(__file__)) if prepared.get("ok") else None
            return emit({"ok": bool(launched and launched.get("ok")), "prepared": prepared, "launched": launched})
        finally:
            os.close(lock)
    if command == "cancel":
        return emit(cancel(home, attempt_id, given.get("--reason", "cancelled"), grace))
    if command == "status":
        return emit(status(home, attempt_id))
    return supervise(home)


if __name__ == "__main__":
    sys.exit(main())
