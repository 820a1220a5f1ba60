"""`depends_on` in a job (issue 36 §2): its two forms, the checks that name the entry, and the cycle check of a
file's jobs. The scheduler's side (waiting, met, never met) is `tpuq.scheduler.dependencies`."""

from __future__ import annotations

from re import Pattern
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# `depends_on` (dstack#2808's name): at most this many names, each a job id or a group's id (its tasks).
MAX_DEPENDENCIES = 100


class DependsOnAny(BaseModel):
    """`depends_on: {any: [...]}`: wait until each has ended, whatever its outcome (a job that evaluates or
    cleans up after a run that may fail)."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # as tpuq.contracts.jobspec.StrictModel

    any: list[str] = Field(min_length=1, max_length=MAX_DEPENDENCIES)


def dependency_names(depends_on: "list[str] | DependsOnAny | None") -> list[str]:
    """The job or group ids a `depends_on` names, in order."""
    if depends_on is None:
        return []
    return list(depends_on.any if isinstance(depends_on, DependsOnAny) else depends_on)


def check_depends_on(value: Any, job_id: Pattern[str]) -> None:
    """Before pydantic parses `depends_on`: each refusal names the entry (`depends_on[1]: ...`). `job_id`: what a
    job id looks like (`tpuq.contracts.jobspec.JOB_ID_RE`)."""
    if value is None:
        return
    where = "depends_on"
    if isinstance(value, dict):
        if set(value) != {"any"}:
            raise ValueError("depends_on: a mapping takes one key, `any` ({any: [id, ...]}: wait until each has "
                             "ended); a list of ids waits until each has succeeded")
        value, where = value["any"], "depends_on.any"
    if isinstance(value, str):
        raise ValueError(f"{where}: give a list of job or group ids, e.g. [{value}]")
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: give a non-empty list of job or group ids")
    if len(value) > MAX_DEPENDENCIES:
        raise ValueError(f"{where}: names {len(value)} jobs; at most {MAX_DEPENDENCIES}")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not job_id.match(name):
            raise ValueError(f"{where}[{i}]: {name!r} is not a job or group id (1-63 lowercase letters, digits or "
                             "'-', starting with a letter or digit)")
        if value.index(name) != i:
            raise ValueError(f"{where}[{i}]: {name!r} is named twice")


def refuse_dependency_cycles(jobs) -> None:
    """Jobs of one file may depend on each other (prepare, then a train sweep, then eval), but not in a cycle:
    none of its jobs could ever start. Refused naming the entry that closes it."""
    index = {j.id: i for i, j in enumerate(jobs) if j.id}
    edges = {j.id: [n for n in dependency_names(j.depends_on) if n in index] for j in jobs if j.id}
    done: set[str] = set()
    for start in edges:
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(edges[start]))]
        path.append(start), on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop(), path.pop(), on_path.discard(node), done.add(node)
            elif child in on_path:
                cycle = path[path.index(child):] + [child]
                k = dependency_names(jobs[index[node]].depends_on).index(child)
                raise ValueError(f"jobs[{index[node]}].depends_on[{k}]: {' -> '.join(map(repr, cycle))} is a "
                                 "cycle: none of these jobs could ever start")
            elif child not in done:
                stack.append((child, iter(edges[child])))
                path.append(child), on_path.add(child)
