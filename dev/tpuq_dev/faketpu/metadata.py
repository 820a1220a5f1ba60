"""A worker host's metadata server: what `http://metadata.google.internal/computeMetadata/v1/` answers on a TPU VM.

Each fake host gets one, on its own internal address, port 80; the host's /etc/hosts (hostsetup.py) maps
`metadata.google.internal` and `metadata` to that address, so the production URLs work there unchanged.

What it serves, as Compute Engine does ("About VM metadata" and "Query VM metadata",
https://cloud.google.com/compute/docs/metadata/querying-metadata):
- every request must carry `Metadata-Flavor: Google`, else 403 ("Troubleshoot the metadata server",
  https://cloud.google.com/compute/docs/troubleshooting/troubleshoot-metadata-server: 403 when a request fails the
  security checks); one carrying `X-Forwarded-For` is refused too (a proxied request). Answers carry
  `Metadata-Flavor: Google`;
- `instance/preempted`: FALSE, TRUE from the preemption notice on (Compute Engine, "Detect if a VM was
  preempted"; about 30 s before a spot VM stops);
- `instance/maintenance-event`: NONE, or TERMINATE_ON_HOST_MAINTENANCE during the notice ("Monitor and plan for a
  host maintenance event": NONE, MIGRATE_ON_HOST_MAINTENANCE, TERMINATE_ON_HOST_MAINTENANCE);
- `instance/attributes/` (the keys, one a line) and `instance/attributes/KEY`: the node's metadata (ssh-keys...)
  plus what a TPU VM adds, `accelerator-type` and `agent-worker-number`;
- `project/project-id`.
Anything else is 404. `?wait_for_change=true` (a hanging GET) is not served: 400 says so, rather than an answer
at once that a client would take for a change. The token endpoint is not served either (fake GCS needs none).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

METADATA_PORT = 80
METADATA_HOST_NAMES = ("metadata.google.internal", "metadata")  # the full and the short name, as on GCE
BASE_PATH = "/computeMetadata/v1/"
FLAVOR_HEADER = "Metadata-Flavor"
FLAVOR = "Google"
MISSING_FLAVOR = f"Missing {FLAVOR_HEADER}:{FLAVOR} header."
NO_MAINTENANCE = "NONE"
TERMINATE_ON_HOST_MAINTENANCE = "TERMINATE_ON_HOST_MAINTENANCE"


@dataclass
class InstanceMetadata:
    """What one host's metadata server says; the fake's preemption notice changes it (`give_preemption_notice`)."""

    project_id: str = ""
    attributes: dict[str, str] = field(default_factory=dict)
    preempted: bool = False
    maintenance_event: str = NO_MAINTENANCE
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def give_preemption_notice(self) -> None:
        with self._lock:
            self.preempted = True
            self.maintenance_event = TERMINATE_ON_HOST_MAINTENANCE

    def set_attribute(self, key: str, value: str) -> None:
        """An attribute the TPU runtime writes after boot (a multislice worker's `tpu-env`: slices.py)."""
        with self._lock:
            self.attributes[key] = value

    def values(self) -> dict[str, str]:
        """path under /computeMetadata/v1/ -> answer."""
        with self._lock:
            values = {
                "instance/preempted": "TRUE" if self.preempted else "FALSE",
                "instance/maintenance-event": self.maintenance_event,
                "instance/attributes/": "".join(f"{k}\n" for k in sorted(self.attributes)),
                **{f"instance/attributes/{k}": v for k, v in self.attributes.items()},
            }
        if self.project_id:
            values["project/project-id"] = self.project_id
        return values


def answer(metadata: InstanceMetadata, method: str, target: str, headers: dict[str, str]) -> tuple[int, str]:
    """(HTTP status, body) for one request. Pure but for reading `metadata`."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if lowered.get(FLAVOR_HEADER.lower()) != FLAVOR or "x-forwarded-for" in lowered:
        return 403, MISSING_FLAVOR
    url = urlsplit(target)
    if method != "GET":
        return 405, f"{method} is not allowed here."
    query = parse_qs(url.query)
    if query.get("wait_for_change"):
        return 400, "wait_for_change is not served by the fake's metadata server; poll instead."
    if query.get("alt", ["text"])[0] != "text":
        return 400, "only alt=text is served by the fake's metadata server."
    if not url.path.startswith(BASE_PATH):
        return 404, "Not Found"
    value = metadata.values().get(url.path[len(BASE_PATH):])
    return (404, "Not Found") if value is None else (200, value)


class _Handler(BaseHTTPRequestHandler):
    server_version = "Metadata Server for VM"  # what GCE's Server header says
    sys_version = ""
    metadata: InstanceMetadata  # set per server

    def _respond(self) -> None:
        status, body = answer(self.server.metadata, self.command, self.path, dict(self.headers.items()))  # type: ignore[attr-defined]
        data = body.encode()
        self.send_response(status)
        self.send_header(FLAVOR_HEADER, FLAVOR)
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _respond

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass


class MetadataServer:
    """`InstanceMetadata` served on (address, port) by a daemon thread until `stop()`."""

    def __init__(self, address: str, metadata: InstanceMetadata, port: int = METADATA_PORT) -> None:
        self.metadata = metadata
        self._http = ThreadingHTTPServer((address, port), _Handler)
        self._http.daemon_threads = True
        self._http.metadata = metadata  # type: ignore[attr-defined]
        self.address, self.port = self._http.server_address[:2]
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"metadata-{address}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)
