"""The claimer's HTTP sessions keep as many connections as a watch pass opens at once (`tpuq.runtime.httppool`):
concurrent reads through them reuse their connections, instead of closing every one returned beyond the tenth
and opening new ones on the next pass; and the node reader's first pass makes one session, not one per read."""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tpuq.claimer.tpuapi import NodeJsonReader
from tpuq.runtime.clients import Clients
from tpuq.runtime.httppool import POOL_SIZE
from tpuq.runtime.settings import Settings

CONCURRENT = 24  # more than requests' own 10 a host, as many as two handlings' watch passes at once


class _Counting(BaseHTTPRequestHandler):
    """Answers every GET with a node's JSON after a short wait (so that the reads overlap), keeping connections
    open (HTTP/1.1); counts the connections opened."""

    protocol_version = "HTTP/1.1"
    opened = 0
    lock = threading.Lock()
    all_in = threading.Barrier(CONCURRENT)

    def setup(self):
        super().setup()
        with _Counting.lock:
            _Counting.opened += 1

    def do_GET(self):
        try:
            _Counting.all_in.wait(timeout=10)  # every read of the round holds its connection at once
        except threading.BrokenBarrierError:
            pass
        body = json.dumps({"name": self.path, "state": "READY"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


@pytest.fixture
def server():
    _Counting.opened = 0
    _Counting.all_in = threading.Barrier(CONCURRENT)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_concurrent_node_reads_reuse_their_connections(server, caplog):
    reader = NodeJsonReader(server)
    names = [f"projects/p/locations/z/nodes/n{i}" for i in range(CONCURRENT)]
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"), ThreadPoolExecutor(CONCURRENT) as pool:
        for _ in range(3):  # three watch passes
            assert [r["state"] for r in pool.map(reader, names)] == ["READY"] * CONCURRENT
    # requests' default adapter keeps 10: each pass would close 14 and the next open 14 new ones (52 in all); a
    # session made by each of the first pass's reads would leave one kept, the next pass opening 23 (47 in all).
    assert _Counting.opened == CONCURRENT
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


def test_the_tpu_clients_session_keeps_as_many(server):
    clients = Clients(Settings(project="p", tpu_endpoint=server))
    session = clients.tpu._transport._session  # where google-cloud-tpu's REST transport keeps it
    for url in (server, "https://tpu.googleapis.com"):
        assert session.get_adapter(url)._pool_maxsize == POOL_SIZE
    assert NodeJsonReader(server)._get_session().get_adapter(server)._pool_maxsize == POOL_SIZE


def test_another_adapter_is_kept():
    """google-auth mounts its mutual-TLS adapter when client certificates are on: it is not replaced."""
    import requests
    from requests.adapters import HTTPAdapter

    from tpuq.runtime.httppool import widened

    class MutualTls(HTTPAdapter):
        pass

    session = requests.Session()
    mtls = MutualTls()
    session.mount("https://", mtls)
    widened(session)
    assert session.get_adapter("https://tpu.googleapis.com") is mtls
    assert session.get_adapter("http://127.0.0.1:1")._pool_maxsize == POOL_SIZE
