"""is_ours (every delete goes through it) and the SSH public key provider."""

import pytest

from tpuq.claimer.sshkeys import default_provider, ssh_keys_metadata
from tpuq.contracts.errors import Permanent
from tpuq.contracts.fleet import FleetFile
from tpuq.runtime.ownership import is_ours

FLEET = FleetFile.model_validate({"name": "f1", "project": "p", "owner_prefix": "tq", "ssh_key_secret": "exec-key",
                                  "tpus": [{"id": "a", "type": "v4-8", "zones": ["us-central2-b"]}]})
QR = "projects/p/locations/us-central2-b/queuedResources/"


def qr(name, labels):
    return {"name": QR + name, "tpu": {"nodeSpec": [{"node": {"labels": labels}}]}}


@pytest.mark.parametrize("resource,ours", [
    (qr("tq-r1-us-central2-b", {"tpuq-owner": "tq", "tpuq-fleet": "f1"}), True),
    (qr("tq-r1-us-central2-b", {}), False),  # name alone is not enough
    (qr("users-node", {"tpuq-owner": "tq", "tpuq-fleet": "f1"}), False),  # label alone is not enough
    (qr("tq-r1-us-central2-b", {"tpuq-owner": "tq", "tpuq-fleet": "other"}), False),
    ({"name": "projects/p/locations/z/nodes/tq-x", "labels": {"tpuq-owner": "tq"}}, True),
])
def test_is_ours_needs_both_marks(resource, ours):
    assert is_ours(resource, FLEET) is ours


def test_key_from_env_file_or_secret_and_never_a_private_key(tmp_path):
    pub = "ssh-ed25519 AAAAC3Nz user@host"
    assert default_provider({"TPUQ_SSH_PUBLIC_KEY": pub})(FLEET) == "ssh-ed25519 AAAAC3Nz"
    path = tmp_path / "k.pub"
    path.write_text(pub + "\n")
    assert default_provider({"TPUQ_SSH_PUBLIC_KEY_FILE": str(path)})(FLEET) == "ssh-ed25519 AAAAC3Nz"
    read = []
    provider = default_provider({}, secret_reader=lambda project, name: read.append((project, name)) or pub)
    assert provider(FLEET) == "ssh-ed25519 AAAAC3Nz" and read == [("p", "exec-key-public")]
    with pytest.raises(Permanent, match="private key"):
        default_provider({"TPUQ_SSH_PUBLIC_KEY": "-----BEGIN OPENSSH PRIVATE KEY-----\nxx"})(FLEET)
    assert ssh_keys_metadata("tpuq", "ssh-ed25519 AAAA") == "tpuq:ssh-ed25519 AAAA tpuq-executor"
