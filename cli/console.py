"""The CLI's two consoles and its user error: what every command module prints with."""

from __future__ import annotations

from rich.console import Console

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class CliError(Exception):
    """An error the user can act on: printed as one line."""


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
