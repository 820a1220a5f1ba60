"""The `tpuq` command line (the console script is `tpuq.cli:main`).

app: the typer app, its command table and `main`; connecting: how the CLI finds its backend; views: rendering;
files, jobs, fleet, deploy, dev: one module per command group; console: the consoles and CliError.
"""

from tpuq.cli.app import app, main
from tpuq.cli.console import CliError

__all__ = ["CliError", "app", "main"]
