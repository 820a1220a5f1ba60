"""HTTP sessions that keep as many connections as a service opens at once.

google-auth's `AuthorizedSession` (the session of google-cloud-tpu's REST transport, and of the claimer's node
reader) is a requests `Session`, whose adapter keeps at most 10 open connections per host. The claimer reads up to
`TpuApi.max_workers` (16) queued resources and nodes at once, in each of up to 20 concurrent handlings
(infra/services.yaml): every connection returned beyond the tenth is closed ("Connection pool is full, discarding
connection", hundreds a minute under load), and the next read opens a new TLS connection to tpu.googleapis.com.
Only how many idle connections are kept changes: requests still opens as many as the threads ask for.
"""

from __future__ import annotations

from typing import Any

# Idle connections kept per host: four times one watch pass's fan-out, well under a Cloud Run instance's file limit.
POOL_SIZE = 64


def widened(session: Any, size: int = POOL_SIZE) -> Any:
    """`session` (a requests `Session`) with adapters that keep `size` connections per host; returned. Only requests'
    own adapter is replaced: another (google-auth's mutual-TLS adapter, when client certificates are on) is kept."""
    from requests.adapters import HTTPAdapter

    for prefix in ("https://", "http://"):
        if type(session.get_adapter(prefix)) is HTTPAdapter:
            session.mount(prefix, HTTPAdapter(pool_maxsize=size))
    return session


def widen_rest_client(client: Any, size: int = POOL_SIZE) -> Any:
    """A google-cloud REST client (`transport="rest"`) whose transport's session keeps `size` connections per host.
    The transport keeps its `AuthorizedSession` as `_session` (generated code, the same in every google-cloud REST
    client); tests/unit/test_http_pool.py fails if a new version moves it."""
    widened(client._transport._session, size)
    return client
