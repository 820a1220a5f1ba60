"""The command line: one subcommand per call, one JSON object on stdout."""

from __future__ import annotations

import argparse
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



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpuq-supervisor")
    parser.add_argument("--home", default=os.path.expanduser("~"))
    sub = parser.add_subparsers(dest="command", required=True)
    p_prepare = sub.add_parser("prepare")
    p_start = sub.add_parser("start")  # prepare, then launch: one process for a one-worker slice
    p_start.add_argument("--attempt-id", required=True)
    p_launch = sub.add_parser("launch")
    p_launch.add_argument("--attempt-id", required=True)
    for locking in (p_prepare, p_start, p_launch):
        # How long to wait for another holder of the control lock: the executor passes what is left of its start's
        # time, so a copy of the work it gave up on does not begin later (tpuq.executor.budget).
        locking.add_argument("--lock-wait", type=float, default=CONTROL_LOCK_WAIT_SECONDS)
    p_cancel = sub.add_parser("cancel")
    p_cancel.add_argument("--attempt-id", required=True)
    p_cancel.add_argument("--reason", default="cancelled")
    p_cancel.add_argument("--grace", type=float, default=None)
    p_status = sub.add_parser("status")
    p_status.add_argument("--attempt-id", default=None)
    sub.add_parser("supervise")
    args = parser.parse_args(argv)
    home = os.path.abspath(args.home)

    if args.command in ("prepare", "launch", "start"):
        spec_text = sys.stdin.read() if args.command in ("prepare", "start") else ""
        lock = control_lock(home, args.lock_wait)
        if lock is None:
            return emit({"ok": False, "kind": "infra", "reason": "another prepare or launch holds this worker"})
        try:
            if args.command == "prepare":
                return emit(prepare(home, spec_text))
            if args.command == "launch":
                return emit(launch(home, args.attempt_id, os.path.abspath(__file__)))
            # start: prepare, then launch, in one process (a one-worker slice has no other worker to wait for)
            prepared = prepare(home, spec_text)
            launched = launch(home, args.attempt_id, os.path.abspath(__file__)) if prepared.get("ok") else None
            return emit({"ok": bool(launched and launched.get("ok")), "prepared": prepared, "launched": launched})
        finally:
            os.close(lock)
    if args.command == "cancel":
        return emit(cancel(home, args.attempt_id, args.reason, args.grace))
    if args.command == "status":
        return emit(status(home, args.attempt_id))
    return supervise(home)


if __name__ == "__main__":
    sys.exit(main())
