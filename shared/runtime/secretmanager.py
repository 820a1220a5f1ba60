"""Shell: Secret Manager over REST v1, the one place tpuq reads or writes a secret.

A webhook URL is a credential (tpuq.contracts.notify): it lives in Secret Manager, and a destination names the
secret. The janitor reads it (`access`) when it delivers; `tpuq submit` and `tpuq fleet apply` store an inline
URL (`put`) and let the janitor read it (`grant_accessor`).

Production: https://secretmanager.googleapis.com with google-auth's AuthorizedSession and the default credentials.
Locally the fake's Google APIs server (tpuq_dev.faketpu.secretmanager), named by TPUQ_SECRETMANAGER_API_ENDPOINT
(`Settings.secretmanager_endpoint`), with no credentials, as tpuq.capacity.cloudchecks reads Cloud Quotas.

No message of an error raised here holds a payload: only the secret's name, the HTTP status and Google's message.
"""

from __future__ import annotations

import base64
import threading
import time
from typing import Any, Callable

SECRETMANAGER_URL = "https://secretmanager.googleapis.com"
ACCESSOR_ROLE = "roles/secretmanager.secretAccessor"
# setIamPolicy with a stale etag answers 409 ABORTED ("the request fails with a 409 error code and ABORTED
# status", IAM v2 UpdatePolicyRequest.policy): read, modify and write again.
GRANT_ATTEMPTS = 5


class SecretError(Exception):
    """Secret Manager could not be read or written; the message names the secret, never its value."""


class SecretNotFound(SecretError):
    """The secret, or the version asked for, does not exist."""


class SecretAccessDenied(SecretError):
    """The caller may not read (or write) the secret: roles/secretmanager.secretAccessor is missing."""


class SecretManager:
    def __init__(self, project: str, endpoint: str | None = None, session: Any = None, timeout: float = 10.0):
        self.project = project
        self.base = (endpoint or SECRETMANAGER_URL).rstrip("/") + "/v1/"
        if session is None:
            if endpoint:  # a local stand-in takes anonymous callers
                import requests

                session = requests.Session()
            else:
                session = LazyAuthorizedSession()
        self.session = session
        self.timeout = timeout

    @classmethod
    def from_settings(cls, settings: Any, **kw: Any) -> "SecretManager":
        return cls(settings.project, settings.secretmanager_endpoint, **kw)

    # ------------------------------------------------------------------ names
    def secret_path(self, secret: str) -> str:
        """`ID` or `projects/P/secrets/ID` (a secret of another project) as a resource name."""
        return secret if secret.startswith("projects/") else f"projects/{self.project}/secrets/{secret}"

    # ------------------------------------------------------------------ calls
    def _call(self, method: str, path: str, what: str, **kw: Any) -> dict:
        try:
            response = self.session.request(method, self.base + path, timeout=self.timeout, **kw)
        except Exception as e:  # unreachable, DNS, TLS, credentials
            raise SecretError(f"Secret Manager could not be reached for {what}: {type(e).__name__}") from None
        if response.status_code < 400:
            try:
                body = response.json() if response.content else {}
            except ValueError:
                raise SecretError(f"{what}: Secret Manager's answer is not JSON") from None
            return body if isinstance(body, dict) else {}
        raise _error(response, what)

    def access(self, secret: str) -> str:
        """The latest version's payload, as UTF-8 text."""
        name = self.secret_path(secret)
        body = self._call("GET", f"{name}/versions/latest:access", f"secret {secret}")
        payload = body.get("payload") or {}
        try:
            data = base64.b64decode(payload.get("data") or "", validate=True)
        except ValueError:
            raise SecretError(f"secret {secret}: the payload is not base64") from None
        expected = payload.get("dataCrc32c")
        if expected is not None and _crc32c(data) not in (None, int(expected)):
            raise SecretError(f"secret {secret}: the payload's checksum does not match (dataCrc32c)")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise SecretError(f"secret {secret}: the payload is not UTF-8 text") from None

    def put(self, secret_id: str, value: str, labels: dict[str, str] | None = None) -> str:
        """Create the secret if absent (automatic replication), add `value` as its newest version; the version's
        name."""
        parent = f"projects/{self.project}"
        body: dict[str, Any] = {"replication": {"automatic": {}}}
        if labels:
            body["labels"] = dict(labels)
        try:
            self._call("POST", f"{parent}/secrets", f"creating secret {secret_id}", params={"secretId": secret_id},
                       json=body)
        except SecretError as e:
            if not isinstance(e, _AlreadyExists):
                raise
        data = value.encode("utf-8")
        payload: dict[str, Any] = {"data": base64.b64encode(data).decode()}
        crc = _crc32c(data)
        if crc is not None:
            payload["dataCrc32c"] = str(crc)
        version = self._call("POST", f"{parent}/secrets/{secret_id}:addVersion", f"adding a version to {secret_id}",
                             json={"payload": payload})
        return str(version.get("name") or "")

    def grant_accessor(self, secret_id: str, member: str) -> None:
        """Let `member` (`serviceAccount:EMAIL`, `user:EMAIL`) read the secret: read the policy, add the binding,
        write it back with the etag read; again on a concurrent change."""
        name = self.secret_path(secret_id)
        what = f"the policy of secret {secret_id}"
        for attempt in range(GRANT_ATTEMPTS):
            policy = self._call("GET", f"{name}:getIamPolicy", what)
            bindings = policy.setdefault("bindings", [])
            binding = next((b for b in bindings if b.get("role") == ACCESSOR_ROLE and not b.get("condition")), None)
            if binding is not None and member in binding.get("members", []):
                return
            if binding is None:
                bindings.append({"role": ACCESSOR_ROLE, "members": [member]})
            else:
                binding["members"] = [*binding.get("members", []), member]
            try:
                self._call("POST", f"{name}:setIamPolicy", what, json={"policy": policy})
                return
            except _Aborted:
                time.sleep(min(0.2 * 2 ** attempt, 2.0))
        raise SecretError(f"{what} kept changing under us: granting {ACCESSOR_ROLE} to {member} gave up")


class _AlreadyExists(SecretError):
    pass


class _Aborted(SecretError):
    pass


def _error(response: Any, what: str) -> SecretError:
    try:
        err = response.json().get("error", {})
        message, status = str(err.get("message") or ""), str(err.get("status") or "")
    except (ValueError, AttributeError):
        message, status = "", ""
    text = f"{what}: HTTP {response.status_code}{' ' + status if status else ''}"
    text += f": {' '.join(message.split())[:200]}" if message else ""
    if response.status_code == 404:
        return SecretNotFound(text)
    if response.status_code in (401, 403):
        return SecretAccessDenied(text)
    if status == "ALREADY_EXISTS":
        return _AlreadyExists(text)
    if status == "ABORTED":
        return _Aborted(text)
    return SecretError(text)


def _crc32c(data: bytes) -> int | None:
    try:
        import google_crc32c
    except ImportError:  # google-crc32c comes with google-cloud-storage; without it, no checksum
        return None
    return int(google_crc32c.value(data))


class LazyAuthorizedSession:
    """google-auth's AuthorizedSession with the default credentials, made on the first request (nothing connects
    or reads ADC before); `factory` makes another session (tests)."""

    def __init__(self, factory: Callable[[], Any] | None = None):
        self._factory = factory
        self._session: Any = None
        self._lock = threading.Lock()

    def request(self, method: str, url: str, **kw: Any):
        with self._lock:
            if self._session is None:
                if self._factory is not None:
                    self._session = self._factory()
                else:
                    import google.auth
                    from google.auth.transport.requests import AuthorizedSession

                    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
                    self._session = AuthorizedSession(credentials)
        return self._session.request(method, url, **kw)
