"""The fake's Secret Manager (REST v1), on the Google APIs server (`google_apis_url`), as
secretmanager.googleapis.com is a host of its own. Enough for tpuq.runtime.secretmanager and for
`gcloud secrets create NAME --data-file=-` / `gcloud secrets versions access latest --secret NAME`.

Methods (shapes from https://cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets and
.../projects.secrets.versions):
- `POST /v1/projects/P/secrets?secretId=ID` {replication, labels} → a Secret; `GET /v1/projects/P/secrets` (list);
  `GET /v1/projects/P/secrets/ID`;
- `POST /v1/projects/P/secrets/ID:addVersion` {payload: {data, dataCrc32c}} → a SecretVersion (ENABLED);
- `GET /v1/projects/P/secrets/ID/versions/{N|latest}:access` → {name, payload: {data, dataCrc32c}};
- `GET .../ID:getIamPolicy`, `POST .../ID:setIamPolicy` {policy} with the policy's etag.

Refused as Google refuses, with Google's error JSON ({error: {code, message, status}}):
- a secret id not matching `[a-zA-Z_0-9-]+` or longer than 255: 400 INVALID_ARGUMENT (Secret.name, "The secret
  ID ... must be at most 255 characters" ... "[a-zA-Z_0-9]+"; projects.secrets/create, secretId);
- a payload over 64 KiB: 400 INVALID_ARGUMENT (SecretPayload.data: "Must be no larger than 64KiB",
  https://cloud.google.com/secret-manager/docs/reference/rest/v1/SecretPayload), and a `dataCrc32c` that does not
  match the data: 400 INVALID_ARGUMENT (SecretPayload.dataCrc32c: "SecretManagerService will verify the integrity
  of the received data");
- a missing secret or version: 404 NOT_FOUND; `latest` of a secret with no version: 404 NOT_FOUND
  (versions/access: "projects/*/secrets/*/versions/latest is an alias to the most recently created SecretVersion");
- a secret id that exists: 409 ALREADY_EXISTS;
- setIamPolicy with an etag other than the current one: 409 ABORTED ("If the etag values do not match, the request
  fails with a 409 error code and ABORTED status": google.iam UpdatePolicyRequest.policy, and Policy.etag in
  https://cloud.google.com/secret-manager/docs/reference/rest/v1/Policy). Without an etag the policy is replaced.

Names carry the project as the caller gave it (Google answers with the project number; nothing in tpuq reads it).
The fake keeps no IAM itself: the local stack's IAM check (tpuq_dev.iam.calls) judges each caller's access, and
reads the grants made here (`policies`). `/_fake/secrets` (GET) lists secrets, version counts and policies, never
payloads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import threading
from dataclasses import dataclass, field

from flask import Flask, Response, request

from tpuq_dev.capacitymodel.clock import rfc3339
from tpuq_dev.capacitymodel.errors import ApiError

SECRET_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")  # Secret.name: "[a-zA-Z_0-9-]+", at most 255 characters
MAX_PAYLOAD_BYTES = 64 * 1024  # SecretPayload.data: "Must be no larger than 64KiB"
ACCESS_PATH = re.compile(r"^([^/]+)/versions/([^/:]+):access$")


def crc32c(data: bytes) -> int:
    import google_crc32c

    return int(google_crc32c.value(data))


@dataclass
class FakeSecret:
    project: str
    id: str
    labels: dict[str, str]
    create_time: str
    versions: list[tuple[bytes, str]] = field(default_factory=list)  # (data, createTime), version n at n-1
    bindings: list[dict] = field(default_factory=list)
    policy_version: int = 0  # bumped by each setIamPolicy: the etag

    @property
    def name(self) -> str:
        return f"projects/{self.project}/secrets/{self.id}"

    @property
    def etag(self) -> str:
        return base64.b64encode(hashlib.sha256(f"{self.name}/{self.policy_version}".encode()).digest()[:8]).decode()

    def render(self) -> dict:
        out = {"name": self.name, "replication": {"automatic": {}}, "createTime": self.create_time,
               "etag": f'"{self.etag}"'}
        if self.labels:
            out["labels"] = self.labels
        return out

    def render_version(self, number: int) -> dict:
        return {"name": f"{self.name}/versions/{number}", "createTime": self.versions[number - 1][1],
                "state": "ENABLED", "replicationStatus": {"automatic": {}}, "etag": f'"{number}"',
                "clientSpecifiedPayloadChecksum": True}

    def policy(self) -> dict:
        out: dict = {"version": 1, "etag": self.etag}
        if self.bindings:  # proto3 JSON leaves an empty list out
            out["bindings"] = self.bindings
        return out


class FakeSecretStore:
    def __init__(self, now):
        self.now = now  # () -> datetime: the fake's wall clock
        self.secrets: dict[tuple[str, str], FakeSecret] = {}
        self.lock = threading.Lock()

    def find(self, project: str, secret_id: str) -> FakeSecret:
        secret = self.secrets.get((project, secret_id))
        if secret is None:
            raise ApiError("NOT_FOUND", f"Secret [projects/{project}/secrets/{secret_id}] not found or has no versions.")
        return secret

    def create(self, project: str, secret_id: str, body: dict) -> dict:
        if not SECRET_ID_RE.match(secret_id or ""):
            raise ApiError("INVALID_ARGUMENT", f"The provided secret id [{secret_id}] is invalid: it must be 1 to 255 "
                                               "characters of [a-zA-Z_0-9-]")
        replication = body.get("replication")
        if not isinstance(replication, dict) or not replication:
            raise ApiError("INVALID_ARGUMENT", "Secret.replication is required")
        with self.lock:
            if (project, secret_id) in self.secrets:
                raise ApiError("ALREADY_EXISTS", f"Secret [projects/{project}/secrets/{secret_id}] already exists.")
            secret = FakeSecret(project, secret_id, dict(body.get("labels") or {}), rfc3339(self.now()))
            self.secrets[(project, secret_id)] = secret
            return secret.render()

    def add_version(self, project: str, secret_id: str, body: dict) -> dict:
        payload = body.get("payload") if isinstance(body.get("payload"), dict) else {}
        try:
            data = base64.b64decode(payload.get("data") or "", validate=True)
        except (binascii.Error, ValueError):
            raise ApiError("INVALID_ARGUMENT", "Invalid value at 'payload.data' (TYPE_BYTES): not base64") from None
        if len(data) > MAX_PAYLOAD_BYTES:
            raise ApiError("INVALID_ARGUMENT", f"Secret Payload cannot be larger than {MAX_PAYLOAD_BYTES} bytes "
                                               f"(got {len(data)}).")
        given = payload.get("dataCrc32c")
        if given is not None and int(given) != crc32c(data):
            raise ApiError("INVALID_ARGUMENT", "Checksum mismatch: the payload's dataCrc32c does not match its data.")
        with self.lock:
            secret = self.find(project, secret_id)
            secret.versions.append((data, rfc3339(self.now())))
            return secret.render_version(len(secret.versions))

    def access(self, project: str, secret_id: str, version: str) -> dict:
        with self.lock:
            secret = self.find(project, secret_id)
            if version == "latest":
                number = len(secret.versions)
            elif version.isdigit():
                number = int(version)
            else:
                raise ApiError("INVALID_ARGUMENT", f"Invalid secret version [{version}]: a number or 'latest'")
            if not 1 <= number <= len(secret.versions):
                raise ApiError("NOT_FOUND", f"Secret Version [{secret.name}/versions/{version}] not found.")
            data = secret.versions[number - 1][0]
            return {"name": f"{secret.name}/versions/{number}",
                    "payload": {"data": base64.b64encode(data).decode(), "dataCrc32c": str(crc32c(data))}}

    def set_policy(self, project: str, secret_id: str, body: dict) -> dict:
        policy = body.get("policy") if isinstance(body.get("policy"), dict) else {}
        with self.lock:
            secret = self.find(project, secret_id)
            etag = policy.get("etag")
            if etag and etag != secret.etag:
                raise ApiError("ABORTED", "There were concurrent policy changes. Please retry the whole "
                                          "read-modify-write with exponential backoff.")
            secret.bindings = [{"role": b["role"], "members": sorted(set(b.get("members") or []))}
                               for b in policy.get("bindings") or [] if b.get("role") and b.get("members")]
            secret.policy_version += 1
            return secret.policy()

    def policies(self) -> dict[str, list[dict]]:
        """Each secret's bindings, by resource name (what the stack's IAM check reads)."""
        with self.lock:
            return {s.name: [dict(b) for b in s.bindings] for s in self.secrets.values()}


def _json(body: dict, status: int = 200) -> Response:
    import json

    return Response(json.dumps(body), status=status, mimetype="application/json")


def add_secret_manager_routes(app: Flask, store: FakeSecretStore) -> None:
    def body() -> dict:
        value = request.get_json(force=True, silent=True)
        return value if isinstance(value, dict) else {}

    @app.route("/v1/projects/<project>/secrets", methods=["GET", "POST"])
    def _secrets(project: str):
        if request.method == "POST":
            return _json(store.create(project, request.args.get("secretId", ""), body()))
        with store.lock:
            listed = [s.render() for (p, _), s in sorted(store.secrets.items()) if p == project]
        return _json({"secrets": listed, "totalSize": len(listed)} if listed else {})

    @app.route("/v1/projects/<project>/secrets/<path:rest>", methods=["GET", "POST"])
    def _secret(project: str, rest: str):
        if request.method == "GET":
            m = ACCESS_PATH.match(rest)
            if m:
                return _json(store.access(project, m.group(1), m.group(2)))
            if rest.endswith(":getIamPolicy"):
                with store.lock:
                    return _json(store.find(project, rest.removesuffix(":getIamPolicy")).policy())
            if "/" not in rest and ":" not in rest:
                with store.lock:
                    return _json(store.find(project, rest).render())
        else:
            if rest.endswith(":addVersion"):
                return _json(store.add_version(project, rest.removesuffix(":addVersion"), body()))
            if rest.endswith(":setIamPolicy"):
                return _json(store.set_policy(project, rest.removesuffix(":setIamPolicy"), body()))
        raise ApiError("NOT_FOUND", f"this fake does not serve {request.method} /v1/projects/{project}/secrets/{rest}")

    @app.get("/_fake/secrets")
    def _list_fake():
        with store.lock:
            return _json({"secrets": [{"name": s.name, "versions": len(s.versions), "bindings": s.bindings}
                                      for s in store.secrets.values()]})
