"""Deploy lets the janitor read the fleet's notify secrets (roles/secretmanager.secretAccessor on each, in this
project), once they exist; a missing one is a todo with the command that creates it."""

from __future__ import annotations

import yaml

from tpuq.contracts.fleet import FleetFile
from tpuq.deploy.model import ProjectState
from tpuq.deploy.plan import Target, plan
from tpuq.deploy.infra import load_infra
from tpuq.operations.examples import EXAMPLE_FLEET

FLEET = FleetFile.model_validate({
    **yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh",
    "notify": [{"secret": "team-slack"}, {"secret": "projects/other-proj/secrets/theirs"},
               {"secret": "team-slack", "events": ["failed"]}]})


def janitor_grants(actions) -> list[str]:
    return [a.detail for a in actions if a.verb == "grant" and a.role == "roles/secretmanager.secretAccessor"
            and "tpuq-janitor@" in a.detail]


def test_the_janitor_is_granted_each_existing_notify_secret_of_this_project_once():
    target = Target(fleet=FLEET)
    assert target.notify_secrets == ["team-slack"]
    infra = load_infra(target.variables())
    secrets = {"tpuq-ssh", "tpuq-ssh-public", "team-slack", "theirs"}
    assert janitor_grants(plan(target, infra, ProjectState(secrets=secrets))) == [
        f"on secret team-slack to tpuq-janitor@{FLEET.project}.iam.gserviceaccount.com"]


def test_a_missing_notify_secret_is_a_todo_and_no_grant():
    target = Target(fleet=FLEET)
    actions = plan(target, load_infra(target.variables()), ProjectState(secrets={"tpuq-ssh", "tpuq-ssh-public"}))
    assert janitor_grants(actions) == []
    todo = next(a for a in actions if a.verb == "todo" and a.what == "secret team-slack")
    assert "gcloud secrets create team-slack --data-file=-" in todo.commands[0]
