"""The fleet's `ssh_user` is the one login of every worker: the claimer names it in each node's `ssh-keys`, where
the TPU VM's guest agent creates it with useradd, and the executor logs in as it. A name useradd would refuse leaves
every node without the user and every attempt failing on authentication, so `tpuq validate` (and every parse of the
fleet) refuses it, naming the field and the reason."""

from __future__ import annotations

import pytest

from tpuq.cli.console import CliError
from tpuq.cli.files import validate_data
from tpuq.contracts.fleet import FleetFile

FLEET = {"name": "lab", "project": "p", "tpus": [{"id": "small", "type": "v4-8", "zones": ["us-central2-b"]}]}


@pytest.mark.parametrize("user", ["tpuq", "researcher", "_svc", "ml-runner_2", "a" * 32])
def test_posix_user_names_are_taken(user):
    assert FleetFile.model_validate({**FLEET, "ssh_user": user}).ssh_user == user


def test_the_default_is_tpuq():
    assert FleetFile.model_validate(FLEET).ssh_user == "tpuq"


@pytest.mark.parametrize("user, why", [
    ("", "1-32 lowercase"),
    ("a" * 33, "1-32 lowercase"),                  # utmp's limit
    ("Researcher", "lowercase"),                   # useradd's portable rule has no capitals
    ("1user", "starting with a letter or '_'"),
    ("-user", "starting with a letter or '_'"),   # would be read as an option of useradd
    ("re searcher", "lowercase"),
    ("a:b", "lowercase"),                          # ':' ends the user in `user:key`
    ("a/b", "lowercase"),
    ("machine$", "lowercase"),                     # Samba's machine accounts: no login user
    ("jane.doe", "lowercase"),
    ("root", "ordinary user"),
])
def test_names_the_guest_agent_cannot_create_are_refused_by_validate(user, why):
    with pytest.raises(CliError) as e:
        validate_data({**FLEET, "ssh_user": user}, "fleet")
    message = str(e.value)
    assert "ssh_user:" in message and why in message, message
