"""python -m tpuq_dev.faketpu --host 127.0.0.1 --port 0 --scenario FILE --time-scale X --state-dir DIR [--url-file F]

Prints the URL on stdout (one line) and writes it to --url-file once serving.
SIGTERM/SIGINT stop it cleanly: every worker host is killed.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from tpuq_dev.capacitymodel.scenario import ScenarioError
from .server import FakeTpuServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuq_dev.faketpu", description="A fake Cloud TPU API with real SSH worker hosts.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--scenario", help="scenario YAML (default: the packaged scenarios/default.yaml)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="scenario seconds per real second")
    parser.add_argument("--state-dir", help="where worker host roots live (default: a temp dir)")
    parser.add_argument("--url-file", help="write the URL here once serving")
    parser.add_argument("--google-apis-port", type=int, default=0,
                        help="port of the Cloud Quotas and Cloud Billing stand-ins (default: any free one)")
    parser.add_argument("--google-apis-url-file", help="write their URL here once serving")
    parser.add_argument("--no-worker-hosts", action="store_true", help="synthetic endpoints instead of sshd hosts")
    parser.add_argument("--ssh-reachable", choices=("internal", "external"),
                        help="which worker address sshd answers on: internal (the SSH client is in the VPC: "
                             "vpc/iap fleets) or external (direct); default: the scenario's network.ssh_reachable")
    parser.add_argument("--host-env", action="append", default=[], metavar="KEY=VALUE",
                        help="set in every SSH session on the worker hosts (repeatable), e.g. STORAGE_EMULATOR_HOST")
    args = parser.parse_args(argv)
    host_env = dict(item.split("=", 1) for item in args.host_env if "=" in item)
    if len(host_env) != len(args.host_env):
        parser.error("--host-env takes KEY=VALUE")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s faketpu %(levelname)s %(message)s")

    try:
        server = FakeTpuServer(
            args.scenario,
            time_scale=args.time_scale,
            state_dir=args.state_dir,
            host=args.host,
            port=args.port,
            worker_hosts=not args.no_worker_hosts,
            ssh_reachable=args.ssh_reachable,
            google_apis_port=args.google_apis_port,
            host_env=host_env,
        )
    except (ScenarioError, OSError, ValueError) as e:
        print(f"faketpu: {e}", file=sys.stderr)
        return 2

    stopping = threading.Event()

    def _on_signal(signum, frame):
        stopping.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    url = server.start()
    try:
        for path, value in ((args.google_apis_url_file, server.google_apis_url), (args.url_file, url)):
            if path:
                tmp = Path(path).with_suffix(".tmp")
                tmp.write_text(f"{value}\n")
                tmp.replace(path)  # atomic: readers never see a half-written URL
        print(url, flush=True)
        while not stopping.wait(3600):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
