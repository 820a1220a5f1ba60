"""Shell: serving the dashboard. `local_app` (`tpuq ui`: the CLI's backend and user) and `deployed_app`
(`python -m tpuq.ui` on Cloud Run: the service's environment, the user from Cloud Run's verified token), and
`serve`, a threaded HTTP server on one host and port."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path

from tpuq.ui.app import create_app
from tpuq.ui.identity import ENV_UI_AUTH, UI_AUTH_CLOUD_RUN, CloudRunUser, fixed_user
from tpuq.ui.sessionkey import ENV_SESSION_KEY_FILE, read_key

ENV_PORT = "PORT"  # Cloud Run's: the container listens there (8080 when unset)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def deployed_app(env: Mapping[str, str] | None = None, now: Callable[[], datetime] = _now):
    """The tpuq-ui service: clients from the service's environment (as every service's), users from Cloud Run's
    invoker check (`TPUQ_UI_AUTH=cloudrun`; without it no request is anyone's, so nothing can be changed), sessions
    signed with the key in the file `TPUQ_UI_SESSION_KEY_FILE` names, which every instance shares (a named file that
    cannot be read stops the start: SessionKeyError)."""
    from tpuq.runtime.clients import Clients
    from tpuq.runtime.settings import Settings

    env = dict(os.environ if env is None else env)
    user_of = CloudRunUser() if env.get(ENV_UI_AUTH) == UI_AUTH_CLOUD_RUN else fixed_user(None)
    settings = Settings.from_env(env)
    key = read_key(Path(env[ENV_SESSION_KEY_FILE])) if env.get(ENV_SESSION_KEY_FILE) else None
    return create_app(lambda: Clients(settings), now, user_of, timezone.utc, secret_key=key,
                      backend_line=f"project {settings.project}")


def serve(app, host: str, port: int, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted; `on_ready(url)` once listening (port 0: a free port, named in the URL)."""
    from werkzeug.serving import make_server

    server = make_server(host, port, app, threaded=True)
    shown = f"[{host}]" if ":" in host else host
    if on_ready:
        on_ready(f"http://{shown}:{server.server_port}/")
    try:
        server.serve_forever()
    finally:
        server.server_close()
