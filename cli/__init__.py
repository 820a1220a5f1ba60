"""The `tpuq` command line (the console script is `tpuq.cli:main`).

app: the typer app, its command table and `main`; connecting: how the CLI finds its backend; views: rendering;
files, jobs, fleet, deploy, dev: one module per command group; console: the consoles and CliError.

Importing this package builds nothing: the command table (which also loads the dev commands' entry point) is
built when `main` first runs, so that a module the dev tools import (`tpuq.cli.console`) never pulls the dev
tools back in half-imported.
"""

from tpuq.cli.console import CliError


def main(argv: list[str] | None = None) -> int:
    from tpuq.cli.app import main as run

    return run(argv)


__all__ = ["CliError", "main"]
