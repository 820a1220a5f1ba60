"""Known TPU runtime failure texts: an exit whose last lines show one is the host's failure, not the job's.

The one table of them (`BUILTIN`). Core (pure): the executor's outcome (tpuq.executor.outcome) asks `RuntimeFailures.
find` about the first failing worker's last lines; a match ends the attempt `infra_failed` (retried from the job's
infrastructure budget, on a fresh slice: the scheduler quarantines the slice and the janitor deletes it) instead of
`failed`. Only the FIRST worker to fail is read: when a job's own bug kills worker 0, the other workers then fail with
coordination errors, and those later lines must not turn the job's bug into an infrastructure failure; when a host's
TPU is held, it is that host's (or its waiting peers') error that comes first.

A job adds its own patterns (`JobSpec.infra_failure_patterns`) and may turn the built-in ones off
(`builtin_infra_failure_patterns: false`). Its patterns are checked when it is submitted (`check_pattern`): Python
`re` syntax, bounded in number and length, and without nested repetition (`(a+)+`), whose backtracking could hold the
executor for minutes on one log line. They are searched line by line over the last `TAIL_LINES` lines only, each cut
to `LINE_CHARS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TAIL_LINES = 20  # the lines an attempt's detail shows (tpuq.executor.outcome.TAIL_LINES)
LINE_CHARS = 400  # of each line, the last characters searched
MAX_PATTERNS = 20
MAX_PATTERN_CHARS = 300
# A group with a repetition inside, itself repeated: `(a+)+`, `(.*)*`, `(\w+\s?){2,}`.
_NESTED_REPETITION = re.compile(r"\((?:[^()\\]|\\.)*(?:[+*]|\{\d*,?\d*\})(?:[^()\\]|\\.)*\)(?:[+*]|\{\d*,?\d*\})")


@dataclass(frozen=True)
class KnownFailure:
    name: str  # said in the attempt's detail
    pattern: str  # Python `re`, searched in each line


# Each with the real text it was written from, and where that text was reported.
BUILTIN: tuple[KnownFailure, ...] = (
    # marin-community/marin#4783 (after 13 preemptions; deleting the VM fixed it): "jax.errors.JaxRuntimeError:
    # UNKNOWN: TPU initialization failed: open(/dev/vfio/0): Device or resource busy: Device or resource busy;
    # Couldn't open iommu group /dev/vfio/0"; marin#2618: "Failed to initialize TPU system with error:
    # FAILED_PRECONDITION: open(/dev/vfio/0): Device or resource busy"; google/gvisor#11545 (/dev/vfio/1).
    KnownFailure("TPU device busy", r"open\(/dev/(?:vfio/\d+|accel\d+)\): Device or resource busy"),
    # jax-ml/jax#19971 (a v4-32 whose backend never came up), google-research/t5x#997: "UserWarning: TPU backend
    # initialization is taking more than 60.0 seconds. Did you run your code on all TPU hosts?"
    KnownFailure("TPU backend initialization timed out",
                 r"TPU backend initialization is taking more than [\d.]+ seconds"),
    # jax-ml/jax#22070: "Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid
    # 176028. Not attempting to load libtpu.so in this process."; openxla/xla tpu_initialize_util.cc also says "The
    # TPU is already in use by another process probably owned by another user"; jax-ml/jax#10192: "libtpu.so already
    # in use by another process probably owned by another user". (torch_xla's "libtpu.so already in used by another
    # process" is left out: pytorch/xla#3214 shows it as a harmless warning of working multi-process runs.)
    KnownFailure("libtpu already in use",
                 r"The TPU is already in use by (?:process with pid \d+|another process)"
                 r"|libtpu\.so already in use by another process"),
    # Coordination service unreachable. jax-ml/jax#35905 (TPU v6e-16, the coordinator's port closed):
    # "DEADLINE_EXCEEDED: Deadline Exceeded" then "RPC: /tensorflow.CoordinationService/RegisterTask";
    # marin-community/marin#5258 (a host reused before libtpu released /dev/vfio hangs; its peers fail with)
    # "RPC: /tensorflow.CoordinationService/PollForError"; google/paxml#77: "Coordination service agent in error
    # status: DEADLINE_EXCEEDED".
    KnownFailure("coordination service unreachable",
                 r"/tensorflow\.CoordinationService/(?:RegisterTask|PollForError|Heartbeat|WatchTasks)"
                 r"|Coordination service agent in error status"),
)


def check_pattern(pattern: object) -> str:
    """A job's pattern as given, or ValueError saying what is wrong with it."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise ValueError("a pattern must be a non-empty string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"{pattern[:40]!r}... is {len(pattern)} characters; a pattern may hold at most "
                         f"{MAX_PATTERN_CHARS}")
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{pattern!r} is not a valid regular expression: {e}") from None
    if _NESTED_REPETITION.search(pattern):
        raise ValueError(f"{pattern!r} repeats a group that itself repeats (like (a+)+): such a pattern can take "
                         "exponential time on one line; write it without the nesting")
    return pattern


@dataclass(frozen=True)
class Match:
    name: str
    line: str


@dataclass(frozen=True)
class RuntimeFailures:
    """The patterns one job's exits are read with."""

    failures: tuple[KnownFailure, ...] = BUILTIN

    @classmethod
    def for_job(cls, patterns: list[str] | tuple[str, ...] = (), builtin: bool = True) -> "RuntimeFailures":
        """The built-in table (unless turned off) and the job's own patterns. A pattern that does not compile (the
        spec was checked at submit, so only a hand-made message) is left out rather than failing the judgement."""
        own: list[KnownFailure] = []
        for p in patterns:
            try:
                own.append(KnownFailure("the job's infra_failure_patterns", check_pattern(p)))
            except ValueError:
                continue
        return cls((BUILTIN if builtin else ()) + tuple(own))

    def find(self, tail: str) -> Match | None:
        """The first known failure in the last lines of a worker's output, or None."""
        if not self.failures:
            return None
        lines = [line[-LINE_CHARS:] for line in tail.rstrip("\n").splitlines()[-TAIL_LINES:]]
        compiled = [(f.name, re.compile(f.pattern)) for f in self.failures]
        for line in lines:
            for name, regex in compiled:
                if regex.search(line):
                    return Match(name, line.strip())
        return None
