"""Dev only: record every Google API call a local-stack process makes, and as which service account, for the IAM check.

The emulators (Pub/Sub, Firestore, fake-gcs-server) and the fake Cloud TPU accept anonymous callers, so none of
them can say who called. The stack therefore starts each service through this wrapper:

    python -m tpuq_dev.iam.recording --to FILE --account EMAIL -- tpuq.runtime.entrypoints NAME --host H --port P

which installs two hooks and then runs the module exactly as `python -m tpuq.runtime.entrypoints ...` would (the service's
code is not touched; tpuq knows nothing of this):
- gRPC: every channel the process opens (grpc.insecure_channel / secure_channel, what Google's gRPC clients use)
  is intercepted; each call is one line naming the full method and the request's resource fields
  (`RESOURCE_FIELDS`), and for a write (Commit, BatchWrite) each write's kind, document and precondition, in the
  REST JSON shape, since Firestore's permission depends on them;
- HTTP: requests' `HTTPAdapter.send` (google-auth's AuthorizedSession, the storage and TPU clients, the claimer's
  Cloud Quotas and Cloud Billing reads): each request is one line with its verb, URL, query and, for a JSON body,
  the body.

Each line is `{"account", "kind": "grpc"|"http", ..., "at"}` (`at`: when the call began, epoch seconds: with the
front's delivery log, a timeline of where a job's seconds go), appended to FILE with one write on an O_APPEND descriptor
(a few microseconds; lines from several processes and threads never interleave, and a killed process loses
nothing). `tpuq_dev.iam.calls` reads the file and checks each call against the IAM model.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

RESOURCE_FIELDS = ("name", "parent", "database", "topic", "subscription")
MAX_NAMES = 20  # documents named per batch read: enough to tell which; the permission is the database's
MAX_JSON_BODY = 256 * 1024  # a larger JSON body is left out (no method tpuq calls attaches an account in one)


class Recorder:
    """Appends one JSON line per call to `path`, each naming `account` as the caller."""

    def __init__(self, path: str, account: str):
        self.path, self.account = path, account
        self._fd: int | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def write(self, entry: dict) -> None:
        entry = {"account": self.account, **entry, "thread": threading.current_thread().name, "at": time.time()}
        line = (json.dumps(entry, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            if self._fd is None or self._pid != os.getpid():  # a forked worker (gunicorn) opens its own
                self._fd, self._pid = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), os.getpid()
            os.write(self._fd, line)


# ------------------------------------------------------------------ what one call is (pure)
def _pb(message: Any) -> Any:
    """The protobuf message behind a proto-plus one (Google's clients pass proto-plus messages to the stub)."""
    pb = getattr(type(message), "pb", None)
    if callable(pb):
        try:
            return pb(message)
        except TypeError:
            pass
    return message


def _write_json(write: Any) -> dict:
    """A firestore.v1.Write as the REST API writes it: what it does to which document, and its precondition."""
    out: dict[str, Any] = {}
    kind = write.WhichOneof("operation")
    if kind == "update":
        out["update"] = {"name": write.update.name}
    elif kind == "delete":
        out["delete"] = write.delete
    elif kind == "transform":
        out["transform"] = {"document": write.transform.document}
    if write.update_transforms:
        out["updateTransforms"] = [{"fieldPath": t.field_path} for t in write.update_transforms]
    if write.HasField("current_document"):
        condition = write.current_document.WhichOneof("condition_type")
        out["currentDocument"] = ({"exists": write.current_document.exists} if condition == "exists"
                                  else {"updateTime": "set"} if condition == "update_time" else {})
    return out


def grpc_entry(method: str, request: Any) -> dict:
    """One gRPC call: its full method name, the request's resource fields, and its writes (if it has any)."""
    pb = _pb(request)
    fields = {f.name for f in getattr(pb, "DESCRIPTOR", None).fields} if hasattr(pb, "DESCRIPTOR") else set()
    resource: dict[str, Any] = {}
    for name in RESOURCE_FIELDS:
        if name in fields:
            value = getattr(pb, name)
            if value:
                resource[name] = value
    entry: dict[str, Any] = {"kind": "grpc", "method": method, "resource": resource}
    if "writes" in fields:
        entry["body"] = {"writes": [_write_json(w) for w in pb.writes]}
    if "documents" in fields and pb.documents:  # BatchGetDocuments names its documents here (the first few)
        resource["documents"] = list(pb.documents[:MAX_NAMES])
    return entry


def http_entry(method: str, url: str, headers: Any, body: Any) -> dict:
    """One HTTP request: verb, URL without its query, the query, and a JSON body when it is one."""
    parts = urlsplit(url)
    entry: dict[str, Any] = {"kind": "http", "method": method.upper(),
                             "url": urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")),
                             "query": dict(parse_qsl(parts.query, keep_blank_values=True))}
    content_type = str((headers or {}).get("Content-Type") or (headers or {}).get("content-type") or "")
    if isinstance(body, (bytes, str)) and body and content_type.startswith("application/json"):
        if len(body) > MAX_JSON_BODY:
            entry["body_left_out"] = len(body)
        else:
            try:
                entry["body"] = json.loads(body)
            except ValueError:
                entry["body_left_out"] = len(body)
    return entry


# ------------------------------------------------------------------ the hooks (shell)
def _interceptor(recorder: Recorder):
    import grpc

    class Recording(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                    grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
        def _record(self, details, request) -> None:
            try:
                recorder.write(grpc_entry(details.method, request))
            except Exception as e:  # never break the service: a line saying what could not be read
                recorder.write({"kind": "grpc", "method": details.method, "error": f"{type(e).__name__}: {e}"})

        def _stream(self, details, requests):
            first = True
            for request in requests:
                if first:  # a stream (Listen, Write) names its resource in the first request
                    self._record(details, request)
                    first = False
                yield request

        def intercept_unary_unary(self, continuation, details, request):
            self._record(details, request)
            return continuation(details, request)

        def intercept_unary_stream(self, continuation, details, request):
            self._record(details, request)
            return continuation(details, request)

        def intercept_stream_unary(self, continuation, details, requests):
            return continuation(details, self._stream(details, requests))

        def intercept_stream_stream(self, continuation, details, requests):
            return continuation(details, self._stream(details, requests))

    return Recording()


def install(recorder: Recorder) -> None:
    """Hook gRPC channels and requests' transport in this process, before anything opens either."""
    import grpc
    import requests.adapters

    interceptor = _interceptor(recorder)
    for name in ("insecure_channel", "secure_channel"):
        original = getattr(grpc, name)
        if getattr(original, "_tpuq_recording", False):
            continue

        def make(*args, _original=original, **kwargs):
            return grpc.intercept_channel(_original(*args, **kwargs), interceptor)

        make._tpuq_recording = True
        setattr(grpc, name, make)

    send = requests.adapters.HTTPAdapter.send
    if not getattr(send, "_tpuq_recording", False):
        def recording_send(self, request, *args, **kwargs):
            try:
                recorder.write(http_entry(request.method or "GET", request.url, request.headers, request.body))
            except Exception as e:
                recorder.write({"kind": "http", "method": request.method, "url": request.url,
                                "error": f"{type(e).__name__}: {e}"})
            return send(self, request, *args, **kwargs)

        recording_send._tpuq_recording = True
        requests.adapters.HTTPAdapter.send = recording_send


def wrap(argv: list[str], path: str, account: str) -> list[str]:
    """`[python, -m, MODULE, ARGS...]` run under the recorder, as `account`."""
    python, flag, module, *rest = argv
    assert flag == "-m", argv
    return [python, "-m", __name__, "--to", path, "--account", account, "--", module, *rest]


def main(argv: list[str]) -> None:
    if len(argv) < 6 or argv[0] != "--to" or argv[2] != "--account" or argv[4] != "--":
        sys.exit("usage: python -m tpuq_dev.iam.recording --to FILE --account EMAIL -- MODULE [ARGS...]")
    install(Recorder(argv[1], argv[3]))
    module, *rest = argv[5:]
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
