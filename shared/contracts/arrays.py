"""Arrays and sweeps (issue 36 §1), core (pure): one submitted job that stands for many tasks.

`array: N` is N tasks with indices 0..N-1. Slurm's forms are accepted too (`--array`): `"0-15"`, `"1,3,5"`,
`"0-99:2"` (a step), and a `%K` suffix, `"0-99%8"`: at most K tasks of the group run at once (`max_running: K`
says the same for any group, a sweep's too). `sweep: {NAME: [v1, v2], ...}` is one task per combination of the
values, their product in a stable order: the names in the order given, the last varying fastest (as
`itertools.product`), so the task index of a combination never depends on anything but the file.

A group is expanded by the scheduler's intake (`tpuq.scheduler.arrays`) into ordinary jobs `<id>-<index>`, each
with `group`, `array_index`, `array_size` (and `array_limit`) in its document and TPUQ_ARRAY_INDEX / TPUQ_ARRAY_SIZE
in its environment (jobspec.ARRAY_ENV). The index of an `array:` task is Slurm's (SLURM_ARRAY_TASK_ID: "5-9" makes
tasks 5..9); that of a sweep task is the combination's position, from 0. TPUQ_ARRAY_SIZE is the number of tasks.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# The most tasks one group may hold. Every task is one Firestore document written at intake, in batches of at most
# MAX_WRITES_PER_COMMIT (tpuq.scheduler.arrays), and every pass may read the group's pending tasks: 1,000 keeps one
# submission's intake to a few commits and well inside one request's time, and covers the sweeps researchers run
# (marin#4666: 50 replicas; SkyPilot#9461: 100 runs).
MAX_ARRAY_TASKS = 1000

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
_LIMIT_RE = re.compile(r"^(.*?)%(\d+)$")
_MAX_INDEX = 10**6  # indices are part of job ids: keep them short


@dataclass(frozen=True)
class ArrayShape:
    """An `array:` value understood: its task indices, in order, and its `%K` limit (None: no limit)."""

    indices: tuple[int, ...]
    limit: int | None = None


def parse_array(value: Any) -> ArrayShape:
    """`array:` -> its indices and limit. Raises ValueError saying what is accepted (pydantic names the field)."""
    accepted = 'a number of tasks (array: 8), or Slurm\'s indices: "0-15", "1,3,5", "0-99:2", with "%8" to run at ' \
               "most 8 at once"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{value!r} is not {accepted}")
    limit = None
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{value!r}: an array holds at least 1 task")
        if value > MAX_ARRAY_TASKS:
            raise ValueError(f"{value!r} is {value:,} tasks; a group may hold at most {MAX_ARRAY_TASKS:,}")
        indices = tuple(range(value))
    else:
        text = value.replace(" ", "")
        m = _LIMIT_RE.match(text)
        if m:
            text, limit = m.group(1), int(m.group(2))
            if limit < 1:
                raise ValueError(f"{value!r}: %{limit} would run no task; give %1 or more")
        indices = _slurm_indices(text, value, accepted)  # a string is Slurm's: "8" is the one task 8
    if not indices:
        raise ValueError(f"{value!r}: an array holds at least 1 task")
    if len(indices) > MAX_ARRAY_TASKS:
        raise ValueError(f"{value!r} is {len(indices):,} tasks; a group may hold at most {MAX_ARRAY_TASKS:,}")
    return ArrayShape(indices, limit)


def _slurm_indices(text: str, value: Any, accepted: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE_RE.match(part)
        if not m:
            raise ValueError(f"{value!r} is not {accepted}")
        first, last, step = int(m.group(1)), m.group(2), m.group(3)
        last_i = int(last) if last is not None else first
        step_i = int(step) if step is not None else 1
        if last_i < first or step_i < 1 or last_i > _MAX_INDEX:
            raise ValueError(f"{value!r}: {part!r} is not a range FIRST-LAST[:STEP] with FIRST <= LAST "
                             f"<= {_MAX_INDEX:,}")
        out.extend(range(first, last_i + 1, step_i))
        if len(out) > MAX_ARRAY_TASKS:
            raise ValueError(f"{value!r} is more than {MAX_ARRAY_TASKS:,} tasks; a group may hold at most "
                             f"{MAX_ARRAY_TASKS:,}")
    if len(set(out)) != len(out):
        raise ValueError(f"{value!r} names an index twice")
    return tuple(sorted(out))


def sweep_value(value: Any) -> str:
    """A sweep value as its environment variable holds it: strings as given, true/false, numbers as Python
    writes them (3e-4 -> "0.0003")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"{value!r} is not a string, number or boolean")


def sweep_size(sweep: Mapping[str, list]) -> int:
    size = 1
    for values in sweep.values():
        size *= len(values)
    return size


def sweep_combinations(sweep: Mapping[str, list[str]]) -> Iterator[dict[str, str]]:
    """Each combination's variables, in task order (module docstring)."""
    names = list(sweep)
    for values in itertools.product(*(sweep[n] for n in names)):
        yield dict(zip(names, values))


@dataclass(frozen=True)
class Task:
    """One task of a group: its id and what it adds to the job."""

    id: str
    index: int
    env: dict[str, str]  # the sweep's values for this task (none for an array)


def task_id(group_id: str, index: int) -> str:
    return f"{group_id}-{index}"


def group_tasks(group_id: str, array: Any = None, sweep: Mapping[str, list[str]] | None = None) -> list[Task]:
    """The tasks of a group, in index order (array and sweep were validated by JobSpec)."""
    if sweep:
        return [Task(task_id(group_id, i), i, env) for i, env in enumerate(sweep_combinations(sweep))]
    return [Task(task_id(group_id, i), i, {}) for i in parse_array(array).indices]


def longest_task_suffix(array: Any = None, sweep: Mapping[str, list] | None = None) -> int:
    """How many characters `-<index>` adds to the group's id at most (ids are at most 63 characters)."""
    last = sweep_size(sweep) - 1 if sweep else max(parse_array(array).indices)
    return 1 + len(str(last))


def check_sweep(sweep: Mapping[str, Any], env: Mapping[str, str], reserved: frozenset[str], reserved_prefix: str,
                env_name_re: re.Pattern, max_value_bytes: int, max_env_bytes: int) -> dict[str, list[str]]:
    """A `sweep:` mapping checked and its values made strings. Raises ValueError naming the variable."""
    if not isinstance(sweep, Mapping) or not sweep:
        raise ValueError("must map at least one environment variable to a list of values")
    out: dict[str, list[str]] = {}
    for name, values in sweep.items():
        if not isinstance(name, str) or not env_name_re.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name")
        if name in reserved:
            raise ValueError(f"{name!r} is reserved: the runner sets it")
        if name.startswith(reserved_prefix):
            raise ValueError(f"{name!r} is reserved: names starting with {reserved_prefix} belong to tpuq")
        if name in env:
            raise ValueError(f"{name!r} is also in env: give it in one of the two")
        if not isinstance(values, list) or not values:
            raise ValueError(f"{name}: give a non-empty list of values, e.g. {name}: [1, 2]")
        try:
            strings = [sweep_value(v) for v in values]
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        if len(set(strings)) != len(strings):
            raise ValueError(f"{name}: a value is given twice")
        for s in strings:
            if len(s.encode("utf-8", errors="surrogatepass")) > max_value_bytes:
                raise ValueError(f"{name}: a value is over {max_value_bytes:,} bytes (each task is stored in one "
                                 "Firestore document, at most 1 MiB)")
        out[name] = strings
    size = sweep_size(out)
    if size > MAX_ARRAY_TASKS:
        raise ValueError(f"is {size:,} combinations; a group may hold at most {MAX_ARRAY_TASKS:,}")
    # A task's env is the job's plus one value of each name: the largest must fit as env does.
    widest = sum(len(n.encode()) + max(len(v.encode("utf-8", errors="surrogatepass")) for v in vs)
                 for n, vs in out.items())
    total = widest + sum(len(n.encode()) + len(v.encode("utf-8", errors="surrogatepass")) for n, v in env.items())
    if total > max_env_bytes:
        raise ValueError(f"a task's env (env and one value of each sweep variable) may be {total:,} bytes; env may "
                         f"hold at most {max_env_bytes:,}")
    return out
