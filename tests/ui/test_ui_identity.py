"""Who the deployed dashboard acts for: the account of the ID token Cloud Run's invoker check verified.

Facts relied on (docs/ARCHITECTURE.md, "Push authentication"; Cloud Run troubleshooting, "signature-removed"):
Cloud Run forwards the checked token with its signature replaced by `SIGNATURE_REMOVED_BY_GOOGLE`, in
`X-Serverless-Authorization` when the caller sent that header (then `Authorization` is passed on unchecked),
else in `Authorization`. Such a token's claims are read (expiry, issuer); a token with any other signature did not
come through the check and is verified whole (google-auth, against a local signer's certificate here). A person's
token from `gcloud` (the proxy) has gcloud's client as audience, which Cloud Run accepts: no audience is pinned.
"""

from __future__ import annotations

import json
import time

import pytest

from tpuq.runtime.auth import google_oidc_verifier, strip_signature
from tpuq.ui.identity import CloudRunUser
from tpuq_dev.devstack.front import LocalGoogleSigner

GOOGLE = LocalGoogleSigner.generate()
STRANGER = LocalGoogleSigner.generate()
ALICE = "alice@example.com"
GCLOUD_CLIENT = "32555940559.apps.googleusercontent.com"  # the audience of `gcloud auth print-identity-token`


class _Certs:
    status = 200
    headers: dict = {}
    data = json.dumps({GOOGLE.key_id: GOOGLE.public_pem.decode()}).encode()


def token(signer=GOOGLE, email=ALICE, aud=GCLOUD_CLIENT, at=None, **claims) -> str:
    return signer.mint(email, aud, time.time() if at is None else at, **claims)


@pytest.fixture
def user_of():
    return CloudRunUser(verifier=google_oidc_verifier(lambda url, method="GET", **kw: _Certs()))


@pytest.mark.parametrize("headers, expected", [
    ({"Authorization": f"Bearer {strip_signature(token())}"}, ALICE),  # through the invoker check
    ({"Authorization": f"Bearer {token()}"}, ALICE),  # signed by Google's key: verified whole
    ({"X-Serverless-Authorization": f"Bearer {strip_signature(token())}",
      "Authorization": f"Bearer {strip_signature(token(email='mallory@example.com'))}"}, ALICE),
    ({}, None),
    ({"Authorization": "Bearer not-a-jwt"}, None),
    ({"Authorization": f"Bearer {token(signer=STRANGER)}"}, None),  # signed, but not by Google
    ({"Authorization": f"Bearer {strip_signature(token(at=time.time() - 7200))}"}, None),  # expired
    ({"Authorization": f"Bearer {strip_signature(token(email_verified=False))}"}, None),
])
def test_the_user_is_the_account_cloud_run_checked(user_of, headers, expected):
    assert user_of(headers) == expected


def test_a_deployed_dashboard_without_a_user_changes_nothing(monkeypatch):
    """`python -m tpuq.ui`'s app: with TPUQ_UI_AUTH=cloudrun an anonymous POST is 401; without it nobody is a user."""
    from tpuq.ui.serve import deployed_app

    for env in ({"TPUQ_UI_AUTH": "cloudrun", "GOOGLE_CLOUD_PROJECT": "p"}, {"GOOGLE_CLOUD_PROJECT": "p"}):
        app = deployed_app(env)
        app.testing = True
        client = app.test_client()
        with client.session_transaction() as session:
            session["csrf_token"] = "t"
        assert client.post("/jobs/j/cancel", data={"csrf_token": "t"}).status_code == 401
