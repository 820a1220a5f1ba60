"""`tpuq deploy` reads Cloud Billing (read only) and stops when billing is off: Cloud Run and the TPU API refuse
to work without it. The read is in the schema check with the others (test_api_schemas)."""

from __future__ import annotations

import io

import pytest
import yaml
from rich.console import Console

from tpuq.deploy import gcp
from tpuq.deploy.cli import run_deploy
from tpuq.deploy.infra import load_infra
from tpuq.deploy.plan import Target
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile

from .fakes import ProjectApi, RecordingApi

FLEET = FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh"})


class Billing(RecordingApi):
    def __init__(self, answer):
        super().__init__("cloudbilling")
        self.answer = answer

    def call(self, method, path, params=None, body=None):
        assert (method, path) == ("GET", f"projects/{FLEET.project}/billingInfo")
        if isinstance(self.answer, int):
            raise gcp.ApiError(self.name, method, path, self.answer, "The caller does not have permission")
        return self.answer


def adapters(billing_answer) -> dict:
    made = {name: RecordingApi(name) for name in gcp.BASE_URLS}
    made["crm"] = ProjectApi()
    made["cloudbilling"] = Billing(billing_answer)
    made["fleetstore"] = object()
    return made


@pytest.mark.parametrize("answer, enabled", [
    ({"name": f"projects/{FLEET.project}/billingInfo", "billingEnabled": True}, True),
    ({"name": f"projects/{FLEET.project}/billingInfo"}, False),  # proto3 JSON leaves a false out
    (403, None),  # not allowed to read it: unknown, and a note says so
])
def test_deploy_reads_billing(answer, enabled):
    target = Target(fleet=FLEET)
    state, notes = gcp.read_state(adapters(answer), target, load_infra(target.variables()))
    assert state.billing_enabled is enabled
    assert ("billing: read as empty (HTTP 403)" in notes) is (enabled is None)


@pytest.mark.parametrize("dry_run", [True, False])
def test_deploy_stops_when_billing_is_off(dry_run):
    made = adapters({"name": f"projects/{FLEET.project}/billingInfo"})
    out = io.StringIO()
    code = run_deploy(FLEET, Console(file=out, width=300), dry_run=dry_run, region="us-central1",
                      firestore_location=None, image_tag="t", skip_services=False, offline=False, infra_dir=None,
                      adapters_factory=lambda project: made)
    assert code == 1
    assert f"error: billing is disabled on project {FLEET.project}" in out.getvalue()
    assert all(api.sent == [] for name, api in made.items() if isinstance(api, RecordingApi))


def test_the_billing_adapter_refuses_writes():
    api = gcp.RestApi("cloudbilling", gcp.BASE_URLS["cloudbilling"], session=None)
    with pytest.raises(gcp.NetworkChangeRefused):
        api.call("PUT", f"projects/{FLEET.project}/billingInfo", body={"billingAccountName": ""})
