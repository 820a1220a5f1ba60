"""Where the fake TPU's worker hosts find Cloud Storage: the local stack's fake-gcs-server.

A TPU VM reaches Cloud Storage with its service account through the metadata server; a fake host reaches the
stack's fake-gcs-server instead, through its SSH sessions' environment (sshd SetEnv, so every login shell and the
job the supervisor starts have it; the supervisor strips only SSH_* and TPUQ_*):
- `STORAGE_EMULATOR_HOST`: google-cloud-storage's `storage.Client()` talks to it, anonymously;
- `CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE`: `gcloud storage` (cp, cat, ls, rsync) does, at its JSON API path
  (`/storage/v1/`, checked against fake-gcs-server: cp both ways of a 30 MB object, rsync, ls);
- `CLOUDSDK_AUTH_DISABLE_CREDENTIALS`: and sends no credentials, which it would otherwise ask for.
So a training script that writes to `$CHECKPOINT_GCS_DIR` with either runs unchanged on the local stack.
"""

from __future__ import annotations


def worker_host_env(storage_url: str) -> dict[str, str]:
    """storage_url: fake-gcs-server's base URL, e.g. http://127.0.0.1:PORT (the hosts share the machine's network)."""
    base = storage_url.rstrip("/")
    return {
        "STORAGE_EMULATOR_HOST": base,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": f"{base}/storage/v1/",
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
    }


def host_env_args(env: dict[str, str]) -> list[str]:
    """`python -m tpuq_dev.faketpu` arguments that set `env` on the hosts."""
    return [arg for key, value in sorted(env.items()) for arg in ("--host-env", f"{key}={value}")]
