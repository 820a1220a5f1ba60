"""Shell: the key that signs the dashboard's session cookie, where each session's CSRF token lives (tpuq.ui.app).

Every process serving the dashboard must sign with the same key: a form rendered by one is otherwise refused (403)
by the next, and Cloud Run scales the dashboard to zero, so every cold start voided every open form. Deployed, the
key is the Secret Manager secret `tpuq-ui-session-key`, which `tpuq deploy` makes with random bytes and mounts as a
file (infra/services.yaml; tpuq.deploy.generated_secrets); `TPUQ_UI_SESSION_KEY_FILE` names that file. `tpuq ui`
keeps its key in a file of its own state directory, made on first use and readable by its owner only. The key is
never printed or logged.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from tpuq.contracts.errors import TpuqError

ENV_SESSION_KEY_FILE = "TPUQ_UI_SESSION_KEY_FILE"
KEY_FILE_NAME = "ui-session-key"
KEY_BYTES = 32  # as infra/services.yaml makes the deployed one (random_bytes)
MIN_KEY_BYTES = 32


class SessionKeyError(TpuqError, RuntimeError):
    """The session key file is missing or too short; the message names the file, never its content."""


def read_key(path: Path) -> bytes:
    try:
        key = path.read_bytes()
    except OSError as e:
        raise SessionKeyError(f"cannot read the dashboard's session key file {path}: {e.strerror or e}") from None
    if len(key) < MIN_KEY_BYTES:
        raise SessionKeyError(f"the dashboard's session key file {path} holds {len(key)} bytes; it needs at least "
                              f"{MIN_KEY_BYTES}")
    return key


def ensure_key_file(path: Path, random_bytes: Callable[[int], bytes] = os.urandom) -> bytes:
    """The key in `path`, made first (random, mode 0600) when there is none. The file appears whole or not at all
    (written aside, then hard-linked into place), so two processes starting at once both read the one that won."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # a name of its own, mode 0600
        aside = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(random_bytes(KEY_BYTES))
            os.link(aside, path)
        except FileExistsError:
            pass  # another process made it first: theirs is the key
        finally:
            aside.unlink(missing_ok=True)
    return read_key(path)


def local_key_path(state_dir: str | Path | None) -> Path:
    """`tpuq ui`'s key file: in the local stack's state directory, else in ~/.tpuq."""
    return Path(state_dir if state_dir else Path.home() / ".tpuq") / KEY_FILE_NAME
