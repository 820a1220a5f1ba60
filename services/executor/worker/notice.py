"""The preemption notice, watched while the job runs, and the other reasons the supervisor stops a job itself.

A spot TPU VM learns of its preemption about 30 s before it stops: the metadata server's `instance/preempted`
turns TRUE, and a host maintenance that stops the VM shows in `instance/maintenance-event` (NONE otherwise).
`NoticeWatcher` asks both about once a second from a thread of its own, so that the supervisor's 20 ms loop never
waits on the network, and the supervisor sends the job SIGTERM as soon as it has an answer (Compute Engine:
"Create and use Spot VMs", detecting preemption, https://cloud.google.com/compute/docs/instances/create-use-spot;
"Query the metadata server for maintenance event notices", the maintenance-event key, which changes 60 s before a
maintenance starts, https://cloud.google.com/compute/docs/metadata/getting-live-migration-notice).
"""

from __future__ import annotations

import threading

from .gcs import urllib_request

NOTICE_POLL_SECONDS = 1.0  # how often the metadata server is asked while the job runs
NOTICE_TIMEOUT_SECONDS = 0.5  # per request: the metadata server is on the host's own link, it answers at once
NO_MAINTENANCE = "NONE"
# A live migration (standard VMs only: TPU VMs cannot migrate) keeps the VM and its processes running.
MIGRATION_EVENTS = ("MIGRATE_ON_HOST_MAINTENANCE",)
PREEMPTED = "preempted"


def notice_from(preempted: str | None, maintenance_event: str | None) -> str | None:
    """Pure: what the metadata server's two answers announce, or None (no notice, or no answer: not known).

    `preempted`: the text of instance/preempted ("TRUE" once the VM is being preempted). `maintenance_event`: the
    text of instance/maintenance-event ("NONE", or e.g. "TERMINATE_ON_HOST_MAINTENANCE")."""
    if (preempted or "").strip().upper() == "TRUE":
        return PREEMPTED
    event = (maintenance_event or "").strip().upper()
    if event and event != NO_MAINTENANCE and event not in MIGRATION_EVENTS:
        return f"host maintenance ({event})"
    return None


def read_metadata(url: str | None, timeout: float = NOTICE_TIMEOUT_SECONDS) -> str | None:
    """The metadata value at `url`, or None when there is no URL or no answer (an error is no evidence)."""
    if not url:
        return None
    try:
        request = urllib_request()
        req = request.Request(url, headers={"Metadata-Flavor": "Google"})
        with request.urlopen(req, timeout=timeout) as resp:
            return resp.read(256).decode(errors="replace")
    except Exception:  # noqa: BLE001 - no answer is "not known to be preempted"
        return None


def read_notice(spec: dict, timeout: float = NOTICE_TIMEOUT_SECONDS) -> str | None:
    """Ask the metadata server once (both URLs of the worker spec)."""
    preempted_url, maintenance_url = spec.get("preempted_url"), spec.get("maintenance_event_url")
    if not preempted_url and not maintenance_url:
        return None
    preempted = read_metadata(preempted_url, timeout)
    if notice_from(preempted, None):
        return PREEMPTED
    return notice_from(preempted, read_metadata(maintenance_url, timeout))


class NoticeWatcher:
    """Polls the metadata server in a daemon thread until a notice comes (then `notice` holds it) or `stop()`."""

    def __init__(self, spec: dict, every: float = NOTICE_POLL_SECONDS):
        self.spec = spec
        self.every = every
        self.notice: str | None = None
        self.seen = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "NoticeWatcher":
        if self.spec.get("preempted_url") or self.spec.get("maintenance_event_url"):
            self._thread = threading.Thread(target=self._run, name="notice", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            notice = read_notice(self.spec)
            if notice:
                self.notice = notice
                self.seen.set()
                return
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
