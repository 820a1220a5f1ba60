"""Shell (Secret Manager, files): the executor's SSH *public* key for node metadata (`ssh-keys`).

Locally: $TPUQ_SSH_PUBLIC_KEY (the key text) or $TPUQ_SSH_PUBLIC_KEY_FILE (a
path; `tpuq dev up` writes one). In production: the Secret Manager secret
named `<fleet.ssh_key_secret>-public` (the executor's private key lives in
`<fleet.ssh_key_secret>`, which the claimer never reads). Anything that looks
like a private key is refused, so none can reach node metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tpuq.contracts.errors import Permanent
from tpuq.contracts.fleet import FleetFile

ENV_PUBLIC_KEY = "TPUQ_SSH_PUBLIC_KEY"
ENV_PUBLIC_KEY_FILE = "TPUQ_SSH_PUBLIC_KEY_FILE"
KEY_COMMENT = "tpuq-executor"
PUBLIC_SECRET_SUFFIX = "-public"

PublicKeyProvider = Callable[[FleetFile], str]
SecretReader = Callable[[str, str], str]  # (project, secret name) -> latest version's text


def checked_public_key(text: str, source: str) -> str:
    """`ssh-ed25519 AAAA...` (type and body only); raises Permanent for a private key or garbage."""
    text = (text or "").strip()
    if "PRIVATE KEY" in text:
        raise Permanent(f"{source} holds a private key; give the executor's public key only")
    parts = text.split()
    if len(parts) < 2 or not (parts[0].startswith("ssh-") or parts[0].startswith("ecdsa-")):
        raise Permanent(f"{source} is not an OpenSSH public key (expected 'ssh-ed25519 AAAA...')")
    return f"{parts[0]} {parts[1]}"


def ssh_keys_metadata(user: str, public_key: str) -> str:
    """The node metadata value: `USER:ssh-ed25519 AAAA... tpuq-executor`."""
    return f"{user}:{public_key} {KEY_COMMENT}"


def _secret_manager_reader(project: str, secret: str) -> str:
    try:
        from google.cloud import secretmanager  # type: ignore[import-not-found]
    except ImportError:
        raise Permanent("google-cloud-secret-manager is not installed; cannot read the SSH public key secret") from None
    client = secretmanager.SecretManagerServiceClient()
    version = client.access_secret_version(name=f"projects/{project}/secrets/{secret}/versions/latest")
    return version.payload.data.decode()


def default_provider(env: Mapping[str, str], secret_reader: SecretReader = _secret_manager_reader) -> PublicKeyProvider:
    """`env`: the variables the process started with (`Settings.env`), read here and nowhere else."""

    def provide(fleet: FleetFile) -> str:
        if env.get(ENV_PUBLIC_KEY):
            return checked_public_key(env[ENV_PUBLIC_KEY], f"${ENV_PUBLIC_KEY}")
        path = env.get(ENV_PUBLIC_KEY_FILE)
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    return checked_public_key(f.read(), path)
            except OSError as e:
                raise Permanent(f"cannot read ${ENV_PUBLIC_KEY_FILE} ({path}): {e}") from None
        if fleet.ssh_key_secret:
            secret = fleet.ssh_key_secret + PUBLIC_SECRET_SUFFIX
            return checked_public_key(secret_reader(fleet.project, secret), f"secret {secret}")
        raise Permanent(
            f"no executor SSH public key: set ${ENV_PUBLIC_KEY} or ${ENV_PUBLIC_KEY_FILE}, "
            "or ssh_key_secret in the fleet file"
        )

    return provide
