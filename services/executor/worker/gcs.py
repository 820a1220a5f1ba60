"""GCS over the JSON API, stdlib only: media uploads and downloads, with retries for transient errors."""

from __future__ import annotations

import json
import time

# urllib.request (with http.client, email, ssl) and urllib.parse are imported where they are used: they are most
# of this script's start-up time, and `status`, `cancel` and the job's start do not need them.


def urllib_request():
    import urllib.request

    return urllib.request


def quote(text: str) -> str:
    import urllib.parse

    return urllib.parse.quote(text, safe="")


def urlencode(query: dict) -> str:
    import urllib.parse

    return urllib.parse.urlencode(query)


class GcsError(Exception):
    def __init__(self, status: int | None, message: str):
        super().__init__(f"GCS {status}: {message}" if status else f"GCS: {message}")
        self.status = status


class Gcs:
    """Minimal GCS JSON API client: media uploads and downloads.

    `token_url` is the metadata server's token endpoint in production; None for an
    emulator that accepts unauthenticated requests.
    """

    def __init__(self, api_base: str, token_url: str | None = None, timeout: float = 30.0):
        self.api_base = api_base.rstrip("/")
        self.token_url = token_url
        self.timeout = timeout
        self._token: str | None = None
        self._token_expiry = 0.0

    def _auth_headers(self) -> dict[str, str]:
        if not self.token_url:
            return {}
        if self._token is None or time.monotonic() > self._token_expiry:
            request = urllib_request()
            req = request.Request(self.token_url, headers={"Metadata-Flavor": "Google"})
            with request.urlopen(req, timeout=self.timeout) as resp:
                body = json.loads(resp.read().decode())
            self._token = body["access_token"]
            # Refresh a minute early so a long upload never starts with a dying token.
            self._token_expiry = time.monotonic() + max(0.0, float(body.get("expires_in", 300)) - 60.0)
        return {"Authorization": f"Bearer {self._token}"}

    def _open(self, req):
        request = urllib_request()
        for name, value in self._auth_headers().items():
            req.add_header(name, value)
        try:
            return request.urlopen(req, timeout=self.timeout)
        except request.HTTPError as e:
            detail = e.read()[:500].decode(errors="replace")
            raise GcsError(e.code, detail) from None
        except (request.URLError, OSError) as e:
            raise GcsError(None, str(e)) from None

    def upload(self, bucket: str, name: str, data: bytes, content_type: str, if_absent: bool = False) -> bool:
        """Upload one object; with if_absent, returns False when it already existed."""
        query = {"uploadType": "media", "name": name}
        if if_absent:
            query["ifGenerationMatch"] = "0"
        url = (
            f"{self.api_base}/upload/storage/v1/b/{quote(bucket)}/o?"
            + urlencode(query)
        )
        req = urllib_request().Request(url, data=data, method="POST", headers={"Content-Type": content_type})
        try:
            with self._open(req) as resp:
                resp.read()
            return True
        except GcsError as e:
            if if_absent and e.status == 412:
                return False
            raise

    def download_to(self, bucket: str, name: str, path: str) -> int:
        url = (
            f"{self.api_base}/storage/v1/b/{quote(bucket)}/o/"
            f"{quote(name)}?alt=media"
        )
        size = 0
        with self._open(urllib_request().Request(url)) as resp, open(path, "wb") as out:
            while True:
                block = resp.read(1 << 20)
                if not block:
                    return size
                out.write(block)
                size += len(block)


def retry(fn, attempts: int, first_delay: float, retry_if=lambda e: True):
    delay = first_delay
    for i in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - the caller's predicate decides
            if i == attempts - 1 or not retry_if(e):
                raise
            time.sleep(delay)
            delay = min(delay * 2, 30.0)


def transient_gcs_error(e: Exception) -> bool:
    return isinstance(e, GcsError) and (e.status is None or e.status == 429 or e.status >= 500)
