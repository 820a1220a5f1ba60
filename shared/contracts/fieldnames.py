"""The field names a model accepts at a place in a document, and the one a misspelt name most likely meant.

`describe_validation_error` says "unknown field" for a name a model forbids; with the model, it also says which
name was meant ("jobs[0].priorty: unknown field; did you mean `priority`?"). The names are read from the model's
own fields (and their aliases), following the error's location through lists, dicts and optional values.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel


def _models_in(annotation: Any) -> list[Any]:
    """The annotation with `Annotated`, optional and union wrappers taken off: each type it may hold."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [t for arg in typing.get_args(annotation) if arg is not type(None) for t in _models_in(arg)]
    return [annotation]


def _step(annotation: Any, part: str | int) -> Any | None:
    """What `annotation` holds at `part` (a field name, a list index, a dict key); None: not one thing."""
    candidates = []
    for kind in _models_in(annotation):
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel) and isinstance(part, str):
            field = kind.model_fields.get(part) or next(
                (f for f in kind.model_fields.values() if f.alias == part), None)
            if field is not None:
                candidates.append(field.annotation)
        elif origin in (list, tuple, set, frozenset) and isinstance(part, int) and args:
            candidates.append(args[0])
        elif origin is dict and isinstance(part, str) and len(args) == 2:
            candidates.append(args[1])
    return candidates[0] if len(candidates) == 1 else None


def known_fields(model: Any, loc: tuple) -> list[str]:
    """The names (and aliases) the model at `loc` within `model` (a pydantic model) accepts; [] when the place is
    not one model."""
    annotation: Any = model
    for part in loc:
        annotation = _step(annotation, part)
        if annotation is None:
            return []
    models = [t for t in _models_in(annotation) if isinstance(t, type) and issubclass(t, BaseModel)]
    if len(models) != 1:
        return []
    fields = models[0].model_fields
    return sorted({*fields, *(f.alias for f in fields.values() if f.alias)})


def did_you_mean(word: str, names: list[str]) -> str | None:
    """The name `word` most likely misspells (difflib's ratio ≥ 0.75), if one."""
    found = difflib.get_close_matches(word, names, n=1, cutoff=0.75)
    return found[0] if found else None
