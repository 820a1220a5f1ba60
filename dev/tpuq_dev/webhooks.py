"""Dev only: the local stack's webhook receiver, where notifications (tpuq.janitor.notify) arrive locally.

It records every POST (path, JSON body, a few headers, time) and answers as scripted per path:

    python -m tpuq_dev.webhooks --host 127.0.0.1 --port 0 --url-file FILE

- `POST /<any path>`: recorded, then answered by the path's script (200 `ok` when none is left).
- `POST /_control/script {"path": "/hook/x", "answers": [{"status": 500}, {"status": 429, "retry_after": "2"},
  {"hang": true}, {"hang_seconds": 5}, {"status": 200, "delay_seconds": 1}], "repeat_last": false}`: the next
  POSTs to that path get these answers in order (`hang`: no answer for an hour, then the connection closed; a
  client's timeout ends it first; `delay_seconds`: a slow answer); `repeat_last`: the last answer stays once the
  others are used.
- `GET /_control/received[?path=/hook/x]` → `{"received": [{path, body, headers, time}, ...]}`, oldest first.
- `POST /_control/reset`: forget what was received and scripted.

`WebhookReceiver(url)` is the client the tests and `tpuq dev notifications` use. The local stack (DevStack) starts
one and stores its `/hook` URL as the secret `tpuq-dev-webhook` in the fake Secret Manager.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import requests

KEPT_HEADERS = ("Content-Type", "User-Agent", "Content-Length")
HANG_SECONDS = 3600.0
CONTROL = "/_control/"


class ReceiverState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[dict] = []
        self.scripts: dict[str, tuple[list[dict], bool]] = {}

    def answer_for(self, path: str) -> dict:
        with self.lock:
            answers, repeat_last = self.scripts.get(path, ([], False))
            if not answers:
                return {"status": 200}
            if len(answers) == 1 and repeat_last:
                return answers[0]
            return answers.pop(0)


def make_handler(state: ReceiverState):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - quiet: the record is the log
            pass

        def _reply(self, status: int, body: dict | str, headers: dict[str, str] | None = None) -> None:
            data = (json.dumps(body) if isinstance(body, dict) else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self):  # noqa: N802
            url = urlsplit(self.path)
            if url.path == CONTROL + "received":
                path = (parse_qs(url.query).get("path") or [None])[0]
                with state.lock:
                    got = [r for r in state.received if path is None or r["path"] == path]
                return self._reply(200, {"received": got})
            return self._reply(200 if url.path == "/" else 404, "webhook receiver")

        def do_POST(self):  # noqa: N802
            url = urlsplit(self.path)
            raw = self._body()
            if url.path == CONTROL + "script":
                spec = json.loads(raw or b"{}")
                with state.lock:
                    state.scripts[spec["path"]] = (list(spec.get("answers") or []), bool(spec.get("repeat_last")))
                return self._reply(200, {"scripted": spec["path"]})
            if url.path == CONTROL + "reset":
                with state.lock:
                    state.received.clear()
                    state.scripts.clear()
                return self._reply(200, {"reset": True})
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            with state.lock:
                state.received.append({"path": url.path, "body": body,
                                       "headers": {h: self.headers[h] for h in KEPT_HEADERS if self.headers.get(h)},
                                       "time": datetime.now(timezone.utc).isoformat()})
            answer = state.answer_for(url.path)
            if answer.get("hang") or answer.get("hang_seconds"):
                time.sleep(float(answer.get("hang_seconds") or HANG_SECONDS))
                self.close_connection = True
                return
            time.sleep(float(answer.get("delay_seconds") or 0))
            headers = {"Retry-After": str(answer["retry_after"])} if answer.get("retry_after") is not None else {}
            return self._reply(int(answer.get("status", 200)), answer.get("body", "ok"), headers)

    return Handler


def serve(host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer((host, port), make_handler(ReceiverState()))
    server.daemon_threads = True  # a hung answer never holds the process
    threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}"


class WebhookReceiver:
    """The receiver's client."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def hook_url(self, path: str = "/hook") -> str:
        return self.url + path

    def received(self, path: str | None = None) -> list[dict]:
        r = requests.get(self.url + CONTROL + "received", params={"path": path} if path else None,
                         timeout=self.timeout)
        r.raise_for_status()
        return r.json()["received"]

    def script(self, path: str, answers: list[dict], repeat_last: bool = False) -> None:
        requests.post(self.url + CONTROL + "script", json={"path": path, "answers": answers,
                                                           "repeat_last": repeat_last},
                      timeout=self.timeout).raise_for_status()

    def reset(self) -> None:
        requests.post(self.url + CONTROL + "reset", timeout=self.timeout).raise_for_status()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuq_dev.webhooks")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--url-file")
    args = parser.parse_args(argv)
    server, url = serve(args.host, args.port)
    print(url, flush=True)
    if args.url_file:
        tmp = args.url_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(url)
        os.replace(tmp, args.url_file)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
