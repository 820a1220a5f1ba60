"""`tpuq ui`: the web dashboard on this machine, against the CLI's backend, as the CLI's user."""

from __future__ import annotations

import typer

from tpuq.cli.console import CliError, err


def ui(port: int = typer.Option(8090, "--port", min=0, max=65535, help="Port to listen on (0: any free one)"),
       host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; keep it local: every request "
                                                            "acts as you")) -> None:
    """Serve the dashboard (jobs, a job's workers and logs, the fleet, dead letters, cost) and print its URL;
    Ctrl-C stops it. It reads what `tpuq list`, `watch`, `logs` and `fleet` read and can cancel a job or set
    its priority, behind a confirmation, as you."""
    from datetime import datetime, timezone

    from tpuq.cli import connecting
    from tpuq.cli.fleet import local_zone
    from tpuq.cli.identity import current_owner
    from tpuq.ui.app import create_app
    from tpuq.ui.identity import fixed_user
    from tpuq.ui.serve import serve
    from tpuq.ui.sessionkey import SessionKeyError, ensure_key_file, local_key_path

    clients = connecting.cli_clients()
    backend = connecting.CURRENT
    try:  # the same key across restarts: a page left open still posts after `tpuq ui` is started again
        key = ensure_key_file(local_key_path(backend.state_dir if backend else None))
    except (SessionKeyError, OSError) as e:
        raise CliError(str(e)) from None
    app = create_app(lambda: clients, lambda: datetime.now(timezone.utc), fixed_user(current_owner()), local_zone(),
                     secret_key=key, backend_line=backend.line if backend else "")

    def ready(url: str) -> None:
        print(f"tpuq ui: {url}  (as {current_owner()}; {backend.line if backend else ''}; Ctrl-C stops it)",
              flush=True)

    try:
        serve(app, host, port, ready)
    except OSError as e:
        raise CliError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    except KeyboardInterrupt:
        err.print("stopped")
