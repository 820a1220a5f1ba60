"""Deployed services accept only Pub/Sub pushes signed for their audience by the push service account.

Tokens are signed with a local RSA key; google-auth's own verification reads the
matching certificate from a transport the test injects, so the production code
path (verify_oauth2_token: signature, expiry, issuer) runs unchanged.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import functions_framework
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt

from tpuq.auth import PushAuth, google_oidc_verifier
from tpuq.entrypoints import source_file

REPO = Path(__file__).resolve().parents[2]
AUDIENCE = "https://tpuq-scheduler-123456789.us-central1.run.app"
PUSH_ACCOUNT = "tpuq-push@my-project.iam.gserviceaccount.com"
KEY_ID = "test-key-1"


def _key_and_cert() -> tuple[bytes, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpuq test signer")])
    now = datetime.now(timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=1))
            .sign(key, hashes.SHA256()))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return pem, cert.public_bytes(serialization.Encoding.PEM)


PRIVATE_PEM, CERT_PEM = _key_and_cert()
OTHER_PRIVATE_PEM, _ = _key_and_cert()  # a key whose certificate the verifier does not know


class _CertsResponse:
    status = 200
    headers: dict = {}
    data = json.dumps({KEY_ID: CERT_PEM.decode()}).encode()


def serve_local_certs(url, method="GET", **kwargs):
    """A google.auth transport that answers the certificate fetch with the local signer's certificate."""
    return _CertsResponse()


def token(private_pem: bytes = PRIVATE_PEM, **overrides) -> str:
    now = int(time.time())
    claims = {"iss": "https://accounts.google.com", "aud": AUDIENCE, "email": PUSH_ACCOUNT,
              "email_verified": True, "sub": "1234", "iat": now, "exp": now + 600}
    claims.update(overrides)
    signer = crypt.RSASigner.from_string(private_pem, key_id=KEY_ID)
    return jwt.encode(signer, claims).decode()


def envelope() -> dict:
    return {"message": {"messageId": "m-1", "data": base64.b64encode(b"{}").decode(), "attributes": {}},
            "subscription": "projects/p/subscriptions/scheduler-ticks"}


@pytest.fixture
def scheduler(monkeypatch):
    """The real scheduler entry point in deployed mode; its tick handler records instead of scheduling."""
    app = functions_framework.create_app("handle", str(source_file("scheduler")), "http")
    service = sys.modules[source_file("scheduler").stem].SERVICE  # the module create_app just loaded
    service.push_auth = PushAuth.from_env(
        {"TPUQ_PUSH_AUTH": "oidc", "TPUQ_PUSH_AUDIENCE": AUDIENCE, "TPUQ_PUSH_SERVICE_ACCOUNT": PUSH_ACCOUNT},
        verifier=google_oidc_verifier(request=serve_local_certs),
    )
    handled = []
    monkeypatch.setitem(service.handlers, "/push/ticks", lambda tick, ctx: handled.append(ctx.message_id))
    client = app.test_client()
    client.handled = handled
    return client


def push(client, bearer: str | None):
    headers = {"Authorization": f"Bearer {bearer}"} if bearer is not None else {}
    return client.post("/push/ticks", json=envelope(), headers=headers)


def test_a_correctly_signed_push_is_handled(scheduler):
    response = push(scheduler, token())
    assert response.status_code == 204
    assert scheduler.handled == ["m-1"]


@pytest.mark.parametrize("bearer", [None, "", "not-a-jwt", token(OTHER_PRIVATE_PEM), token(exp=int(time.time()) - 3600),
                                    token(iss="https://evil.example.com")],
                         ids=["no-header", "empty", "garbage", "unknown-key", "expired", "wrong-issuer"])
def test_a_push_without_a_valid_token_is_refused_with_401(scheduler, bearer):
    response = push(scheduler, bearer)
    assert response.status_code == 401
    assert scheduler.handled == []


@pytest.mark.parametrize("claims", [{"aud": "https://tpuq-janitor-123456789.us-central1.run.app"},
                                    {"email": "someone-else@my-project.iam.gserviceaccount.com"},
                                    {"email_verified": False}],
                         ids=["wrong-audience", "wrong-account", "unverified-email"])
def test_a_valid_token_for_someone_else_is_refused_with_403(scheduler, claims):
    response = push(scheduler, token(**claims))
    assert response.status_code == 403
    assert scheduler.handled == []


def test_health_checks_need_no_token(scheduler):
    assert scheduler.get("/").status_code == 200


def test_half_configured_deployed_mode_refuses_everything(monkeypatch):
    monkeypatch.setenv("TPUQ_PUSH_AUTH", "oidc")
    monkeypatch.delenv("TPUQ_PUSH_AUDIENCE", raising=False)
    monkeypatch.setenv("TPUQ_PUSH_SERVICE_ACCOUNT", PUSH_ACCOUNT)
    client = functions_framework.create_app("handle", str(source_file("janitor")), "http").test_client()
    assert push(client, token()).status_code == 500


def test_local_mode_checks_nothing_and_says_so_once(caplog):
    auth = PushAuth.from_env({})
    with caplog.at_level(logging.WARNING, logger="tpuq.auth"):
        assert auth.check({}, "scheduler") is None
        assert auth.check({"Authorization": "Bearer junk"}, "scheduler") is None
    assert [r.getMessage() for r in caplog.records if "OFF" in r.getMessage()] == [
        "scheduler: push authentication is OFF ($TPUQ_PUSH_AUTH is not 'oidc'): local mode, every push is accepted"
    ]
