"""Deployed services accept only the push service account's pushes, as Cloud Run forwards them.

Behind Cloud Run's invoker check a push's token arrives with its signature replaced by
`SIGNATURE_REMOVED_BY_GOOGLE`: the service must accept that form (and only read claims from it), and must
still verify in full any token that did not come through the check. Tokens are signed by the local stand-in
for Google's key (tpuq_dev.devstack.front.LocalGoogleSigner); google-auth's own verification reads its public key
from a transport the test injects, so the production path (verify_oauth2_token) runs unchanged.

The same file checks that what deploy produces agrees with that design: the subscriptions' OIDC account and
audience, the services' TPUQ_PUSH_* settings, the only run.invoker grants, and the invoker check left on.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import time

import functions_framework
import pytest
import yaml

from tpuq.runtime.auth import SIGNATURE_REMOVED, PushAuth, google_oidc_verifier, strip_signature
from tpuq.runtime.entrypoints import source_file
from tpuq.deploy.infra import load_infra
from tpuq.deploy.plan import Target, desired_run_service
from tpuq.deploy.subscriptions import desired_subscription
from tpuq_dev.devstack.front import LocalGoogleSigner, invoker_emails
from tpuq_dev.devstack.stack import DEMO_DIR
from tpuq.contracts.fleet import FleetFile

AUDIENCE = "https://tpuq-scheduler-123456789.us-central1.run.app"
PUSH_ACCOUNT = "tpuq-push@my-project.iam.gserviceaccount.com"
OWNER = "alice@example.com"  # holds run.invoker through roles/owner: Cloud Run lets her token through
GOOGLE = LocalGoogleSigner.generate()
STRANGER = LocalGoogleSigner.generate()  # a key whose public half the verifier does not know


class _CertsResponse:
    status = 200
    headers: dict = {}
    data = json.dumps({GOOGLE.key_id: GOOGLE.public_pem.decode()}).encode()


def serve_local_certs(url, method="GET", **kwargs):
    """A google.auth transport that answers the certificate fetch with the local signer's public key."""
    return _CertsResponse()


def token(signer: LocalGoogleSigner = GOOGLE, email: str = PUSH_ACCOUNT, **claims) -> str:
    return signer.mint(email, claims.pop("aud", AUDIENCE), time.time(), **claims)


def forwarded(**claims) -> str:
    """A token as Cloud Run's invoker check forwards it to the container."""
    return strip_signature(token(**claims))


def envelope() -> dict:
    return {"message": {"messageId": "m-1", "data": base64.b64encode(b"{}").decode(), "attributes": {}},
            "subscription": "projects/p/subscriptions/scheduler-ticks"}


@pytest.fixture
def scheduler(monkeypatch):
    """The real scheduler entry point in deployed mode; its tick handler records instead of scheduling."""
    app = functions_framework.create_app("handle", str(source_file("scheduler")), "http")
    service = sys.modules[source_file("scheduler").stem].ENTRY.service()  # the module create_app just loaded
    service.push_auth = PushAuth.from_env(
        {"TPUQ_PUSH_AUTH": "oidc", "TPUQ_PUSH_AUDIENCE": AUDIENCE, "TPUQ_PUSH_SERVICE_ACCOUNT": PUSH_ACCOUNT},
        verifier=google_oidc_verifier(request=serve_local_certs),
    )
    handled = []
    monkeypatch.setitem(service.routes, "/push/ticks", lambda tick, ctx: handled.append(ctx.message_id))
    client = app.test_client()
    client.handled = handled
    return client


def push(client, bearer: str | None, header: str = "Authorization", **more_headers):
    headers = {header: f"Bearer {bearer}"} if bearer is not None else {}
    return client.post("/push/ticks", json=envelope(), headers={**headers, **more_headers})


def test_a_push_as_cloud_run_forwards_it_is_handled(scheduler):
    """Fails on a service that verifies the signature again: Cloud Run has removed it."""
    bearer = forwarded()
    assert bearer.endswith("." + SIGNATURE_REMOVED)
    response = push(scheduler, bearer)
    assert response.status_code == 204
    assert scheduler.handled == ["m-1"]


def test_the_same_form_in_x_serverless_authorization_is_handled(scheduler):
    assert push(scheduler, forwarded(), header="X-Serverless-Authorization").status_code == 204
    assert scheduler.handled == ["m-1"]


def test_a_signed_token_that_did_not_come_through_cloud_run_is_verified_whole(scheduler):
    assert push(scheduler, token()).status_code == 204
    assert push(scheduler, token(STRANGER)).status_code == 401
    assert scheduler.handled == ["m-1"]


@pytest.mark.parametrize("bearer", [None, "", "not-a-jwt", "a.b.c", "e30.e30." + SIGNATURE_REMOVED,
                                    forwarded(exp=int(time.time()) - 3600),
                                    forwarded(iss="https://evil.example.com"),
                                    token(exp=int(time.time()) - 3600), token(iss="https://evil.example.com")],
                         ids=["no-header", "empty", "garbage", "not-json", "no-claims", "forwarded-expired",
                              "forwarded-wrong-issuer", "signed-expired", "signed-wrong-issuer"])
def test_a_push_without_a_valid_token_is_refused_with_401(scheduler, bearer):
    response = push(scheduler, bearer)
    assert response.status_code == 401
    assert scheduler.handled == []


@pytest.mark.parametrize("claims", [{"aud": "https://tpuq-janitor-123456789.us-central1.run.app"},
                                    {"email": OWNER},
                                    {"email_verified": False}],
                         ids=["wrong-audience", "owner-not-push-account", "unverified-email"])
@pytest.mark.parametrize("form", [forwarded, token], ids=["forwarded", "signed"])
def test_a_valid_token_for_someone_else_is_refused_with_403(scheduler, claims, form):
    response = push(scheduler, form(**claims))
    assert response.status_code == 403
    assert scheduler.handled == []


def test_the_token_cloud_run_checked_is_the_one_read(scheduler):
    """With X-Serverless-Authorization sent, Cloud Run checks that one and passes Authorization on unchecked:
    a push-account claim in Authorization, whose signature anyone can 'remove', must not count."""
    response = push(scheduler, forwarded(email=OWNER), header="X-Serverless-Authorization",
                    Authorization=f"Bearer {forwarded()}")
    assert response.status_code == 403
    assert scheduler.handled == []


def test_an_empty_x_serverless_authorization_is_no_token_even_beside_authorization(scheduler):
    response = push(scheduler, forwarded(), **{"X-Serverless-Authorization": ""})
    assert response.status_code == 401
    assert scheduler.handled == []


def test_health_checks_need_no_token(scheduler):
    assert scheduler.get("/").status_code == 200


def test_half_configured_deployed_mode_refuses_everything(monkeypatch):
    monkeypatch.setenv("TPUQ_PUSH_AUTH", "oidc")
    monkeypatch.delenv("TPUQ_PUSH_AUDIENCE", raising=False)
    monkeypatch.setenv("TPUQ_PUSH_SERVICE_ACCOUNT", PUSH_ACCOUNT)
    client = functions_framework.create_app("handle", str(source_file("janitor")), "http").test_client()
    assert push(client, forwarded()).status_code == 500


def test_local_mode_checks_nothing_and_says_so_once(caplog):
    auth = PushAuth.from_env({})
    with caplog.at_level(logging.WARNING, logger="tpuq.runtime.auth"):
        assert auth.check({}, "scheduler") is None
        assert auth.check({"Authorization": "Bearer junk"}, "scheduler") is None
    assert [r.getMessage() for r in caplog.records if "OFF" in r.getMessage()] == [
        "scheduler: push authentication is OFF ($TPUQ_PUSH_AUTH is not 'oidc'): local mode, every push is accepted"
    ]


# ------------------------------------------------------- what deploy produces agrees with the design
@pytest.fixture(scope="module")
def deployment():
    data = yaml.safe_load((DEMO_DIR / "fleet.yaml").read_text())
    target = Target(fleet=FleetFile.model_validate({**data, "project": "my-project"}), project_number="123456789")
    return target, load_infra(target.variables())


def test_each_service_expects_exactly_what_its_subscriptions_push_with(deployment):
    target, infra = deployment
    for spec in infra.pubsub.subscriptions:
        oidc = desired_subscription(target, infra, spec)["pushConfig"]["oidcToken"]
        service = desired_run_service(target, infra, spec.service)
        env = {e["name"]: e["value"] for e in service["template"]["containers"][0]["env"]}
        assert env["TPUQ_PUSH_AUTH"] == "oidc"
        assert oidc["audience"] == env["TPUQ_PUSH_AUDIENCE"] == target.service_url(infra, spec.service), spec.name
        assert oidc["serviceAccountEmail"] == env["TPUQ_PUSH_SERVICE_ACCOUNT"], spec.name


def test_only_the_push_account_may_invoke_and_the_invoker_check_stays_on(deployment):
    """The service trusts a removed signature only because Cloud Run checked it: deploy must keep the check on
    (invokerIamDisabled false, also correcting a service where someone turned it off) and grant run.invoker to
    the push account alone."""
    target, infra = deployment
    for spec in infra.services.services:
        body = desired_run_service(target, infra, spec.name)
        assert body["invokerIamDisabled"] is False
        # the dashboard (ui): people only, granted by the project's owner (tests/ui/test_ui_deploy.py)
        pushers = (target.sa_email(infra.pubsub.push_service_account),) if spec.name != "ui" else ()
        assert invoker_emails(infra.iam.bindings, target.member, spec.name) == pushers


def test_deploy_turns_the_invoker_check_back_on(deployment):
    from tpuq.deploy.plan import run_projection

    target, infra = deployment
    desired = desired_run_service(target, infra, "scheduler")
    assert run_projection({**desired, "invokerIamDisabled": True}) != run_projection(desired)
