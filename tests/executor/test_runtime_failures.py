"""Known TPU runtime failure texts (tpuq.contracts.runtime_failures) and how the outcome reads them, with the real
texts users reported; and the preflight's phase in the outcome."""

from __future__ import annotations

from datetime import timedelta

import pydantic
import pytest

from tpuq.contracts.jobspec import JobSpec
from tpuq.contracts.messages import AttemptOutcome
from tpuq.contracts.runtime_failures import BUILTIN, RuntimeFailures, check_pattern
from tpuq.executor.executor import AttemptRef
from tpuq.executor.outcome import Decided, NodeState, WorkerStatus, decide_outcome

from .factories import T0, make_assignment

# (the failure's name in the table, a real last line, where it was reported)
REAL_TEXTS = [
    ("TPU device busy",
     "jax.errors.JaxRuntimeError: UNKNOWN: TPU initialization failed: open(/dev/vfio/0): Device or resource busy: "
     "Device or resource busy; Couldn't open iommu group /dev/vfio/0",
     "marin-community/marin#4783"),
    ("TPU device busy",
     "Failed to initialize TPU system with error: FAILED_PRECONDITION: open(/dev/vfio/0): Device or resource busy: "
     "Device or resource busy; Couldn't open iommu group /dev/vfio/0",
     "marin-community/marin#2618"),
    ("TPU device busy",
     "RuntimeError: Unable to initialize backend 'tpu': UNKNOWN: TPU initialization failed: open(/dev/vfio/1): "
     "Device or resource busy: Device or resource busy; Couldn't open iommu group /dev/vfio/1 (set JAX_PLATFORMS='' "
     "to automatically choose an available backend)",
     "google/gvisor#11545"),
    ("TPU backend initialization timed out",
     "/home/alberta/.local/lib/python3.10/site-packages/jax/_src/xla_bridge.py:146: UserWarning: TPU backend "
     "initialization is taking more than 60.0 seconds. Did you run your code on all TPU hosts? See "
     "https://jax.readthedocs.io/en/latest/multi_process.html for more information.",
     "jax-ml/jax#19971"),
    ("libtpu already in use",
     "INFO:2024-06-25 00:34:55,142:jax._src.xla_bridge:889: Unable to initialize backend 'tpu': ABORTED: The TPU is "
     "already in use by process with pid 176028. Not attempting to load libtpu.so in this process.",
     "jax-ml/jax#22070"),
    ("libtpu already in use",
     "I0000 00:00:1649423660.053391 1924758 f236.cc:165] libtpu.so already in use by another process probably owned "
     "by another user. Run \"$ sudo lsof -w /dev/accel0\" to figure out which process is using the TPU. Not "
     "attempting to load libtpu.so in this process.",
     "jax-ml/jax#10192"),
    ("coordination service unreachable", "RPC: /tensorflow.CoordinationService/RegisterTask", "jax-ml/jax#35905"),
    ("coordination service unreachable", "RPC: /tensorflow.CoordinationService/PollForError",
     "marin-community/marin#5258"),
    ("coordination service unreachable",
     "2024-04-12 23:39:41.656900: E external/xla/xla/pjrt/distributed/client.cc:96] Coordination service agent in "
     "error status: DEADLINE_EXCEEDED: Deadline Exceeded", "google/paxml#77"),
]


@pytest.mark.parametrize("name, line, reported", REAL_TEXTS, ids=[r for _, _, r in REAL_TEXTS])
def test_each_real_text_is_a_known_failure(name, line, reported):
    tail = f"step 1\nTraceback (most recent call last):\n{line}\n"
    match = RuntimeFailures().find(tail)
    assert match is not None and (match.name, match.line) == (name, line.strip())
    assert {name for name, _, _ in REAL_TEXTS} == {f.name for f in BUILTIN}  # every row of the table is tested


@pytest.mark.parametrize("line", [
    "ValueError: shapes (3,) and (4,) not aligned",
    "libtpu.so already in used by another process. Not attempting to load libtpu.so in this process.",  # xla#3214
    "open(/data/train.bin): Device or resource busy",  # not a TPU device
    "RuntimeError: Unable to initialize backend 'tpu': the TPU is busy",
])
def test_the_job_s_own_errors_are_not_known_failures(line):
    assert RuntimeFailures().find(f"{line}\n") is None


def test_only_the_last_lines_are_read():
    old = "UserWarning: TPU backend initialization is taking more than 60.0 seconds. Did you run your code on all..."
    assert RuntimeFailures().find(old + "\n" + "step\n" * 30) is None
    assert RuntimeFailures().find(old + "\n" + "step\n" * 10) is not None


def test_a_job_adds_patterns_and_turns_the_table_off():
    tail = "E0101 my_runtime.cc] HBM ECC error on chip 3\nopen(/dev/vfio/0): Device or resource busy\n"
    assert RuntimeFailures.for_job(["HBM ECC error"]).find(tail).name == "the job's infra_failure_patterns"
    assert RuntimeFailures.for_job([], builtin=False).find(tail) is None
    assert RuntimeFailures.for_job([r"ECC error on chip \d"], builtin=False).find(tail).line.endswith("chip 3")
    assert RuntimeFailures.for_job(["(a+)+"], builtin=False).failures == ()  # unchecked input is left out


@pytest.mark.parametrize("pattern, says", [
    ("[unclosed", "is not a valid regular expression"),
    ("(a+)+$", "repeats a group that itself repeats"),
    (r"(\w+\s?){2,}x", "repeats a group that itself repeats"),
    ("", "non-empty"),
    ("x" * 301, "at most 300"),
])
def test_job_patterns_are_checked_at_submit_naming_the_field(pattern, says):
    from tpuq.cli.console import CliError
    from tpuq.cli.files import validate_data  # what `tpuq validate` and `tpuq submit` run

    with pytest.raises(CliError) as e:
        validate_data({"jobs": [{"tpu": "v4-8", "command": "x", "infra_failure_patterns": ["ok", pattern]}]}, "job")
    assert str(e.value).startswith("invalid job file: jobs[0].infra_failure_patterns[1]: ") and says in str(e.value)
    with pytest.raises(pydantic.ValidationError, match=says.replace("(", r"\(")):  # a job published on the topic
        JobSpec(tpu="v4-8", command="python train.py", infra_failure_patterns=[pattern])
    assert check_pattern(r"ECC error on chip \d+") == r"ECC error on chip \d+"
    assert JobSpec(tpu="v4-8", command="x").builtin_infra_failure_patterns is True


def st(worker: int, exit_code: int | None = 1, at: int = 0, tail: str = "", **kw) -> WorkerStatus:
    return WorkerStatus(worker_id=worker, attempt_id="a1", ended_at=T0 + timedelta(seconds=at),
                        exit_code=exit_code, tail=tail, **kw)


def decide(statuses, workers=4, now_s=60, **kw):
    return decide_outcome(worker_count=workers, statuses={s.worker_id: s for s in statuses}, node_state=NodeState.ready,
                          now=T0 + timedelta(seconds=now_s), **kw)


BUSY = ("jax.errors.JaxRuntimeError: UNKNOWN: TPU initialization failed: open(/dev/vfio/0): Device or resource busy:"
        " Device or resource busy; Couldn't open iommu group /dev/vfio/0\n")
COORDINATION = "jaxlib.xla_extension.XlaRuntimeError: UNAVAILABLE\nRPC: /tensorflow.CoordinationService/PollForError\n"


def test_a_known_failure_on_the_first_failing_worker_is_an_infrastructure_failure():
    d = decide([st(2, tail=BUSY, at=0), st(0, tail=COORDINATION, at=5)])
    assert isinstance(d, Decided) and d.outcome is AttemptOutcome.infra_failed
    assert d.detail.startswith("worker 2's last lines show a TPU runtime failure (TPU device busy): "
                               "jax.errors.JaxRuntimeError")
    assert "worker 2 exited 1" in d.detail and "last lines of worker 2" in d.detail


def test_the_job_s_own_crash_first_then_coordination_errors_stays_the_job_s_failure():
    """Worker 0's bug kills the slice; the others then lose the coordination service. The root cause is the job's."""
    d = decide([st(0, tail="ValueError: bad shape\n", at=0), st(1, tail=COORDINATION, at=3),
                st(2, tail=COORDINATION, at=3), st(3, tail=COORDINATION, at=4)])
    assert d.outcome is AttemptOutcome.failed


def test_a_hung_host_s_peers_failing_on_coordination_first_is_infrastructure():
    """marin#5258: the host whose /dev/vfio was not released hangs; its peers fail on PollForError first."""
    d = decide([st(0, tail=COORDINATION, at=0), st(1, tail=COORDINATION, at=1)])
    assert d.outcome is AttemptOutcome.infra_failed and "(coordination service unreachable)" in d.detail


def test_turned_off_the_same_exit_is_the_job_s_failure_and_a_job_pattern_counts():
    assert decide([st(2, tail=BUSY)], runtime_failures=RuntimeFailures.for_job([], builtin=False)).outcome \
        is AttemptOutcome.failed
    own = RuntimeFailures.for_job(["HBM ECC error"], builtin=False)
    assert decide([st(1, tail="E HBM ECC error\n")], runtime_failures=own).outcome is AttemptOutcome.infra_failed


def test_the_job_s_patterns_reach_the_outcome_from_its_assignment():
    a = make_assignment()
    a = a.model_copy(update={"job": a.job.model_copy(update={"infra_failure_patterns": ["HBM ECC"],
                                                             "builtin_infra_failure_patterns": False})})
    failures = AttemptRef.from_assignment(a).runtime_failures
    assert [f.pattern for f in failures.failures] == ["HBM ECC"]
    assert AttemptRef.from_assignment(make_assignment()).runtime_failures == RuntimeFailures()


def test_a_preflight_status_ends_the_attempt_infra_failed_naming_the_worker_and_holder():
    unfit = st(2, exit_code=None, phase="preflight",
               preflight_error="/dev/vfio/0 is held by pid 4711 (python3 train.py)")
    d = decide([unfit], now_s=0)  # at once: the other workers were prepared but launch nothing
    assert d == Decided(AttemptOutcome.infra_failed,
                        "preflight failed: worker 2: /dev/vfio/0 is held by pid 4711 (python3 train.py)", {})
    setup = st(1, exit_code=None, phase="setup", setup_error="bundle gs://b/x does not exist")
    assert decide([unfit, setup], now_s=0).outcome is AttemptOutcome.failed_setup  # the job's inputs: terminal
    assert decide([unfit], now_s=0, node_problem=None).outcome is AttemptOutcome.infra_failed


def test_after_a_failure_the_workers_still_running_are_stopped():
    """A known failure: the job runs again on another slice, and its hung peers on this one must not run beside it.
    The job's own failure (issue 35 §3): the slice goes to the next job, and must not idle under this one's peers."""
    from tpuq.executor import decide as executor_decide

    known = decide([st(2, tail=BUSY, at=0)])
    assert known.stop_workers and executor_decide.stop_after_end(known, None)
    assert executor_decide.stop_reason(known, None) == (
        "stopped: worker 2's last lines show a TPU runtime failure (TPU device busy): jax.errors.JaxRuntimeError: "
        "UNKNOWN: TPU initialization failed: open(/dev/vfio/0): Device or resource busy: Device or resource busy; "
        "Couldn't open iommu group /dev/vfio/0; worker 2 exited 1; no status yet from worker 0, 1, 3")
    own = decide([st(2, tail="ValueError: bad shape\n", at=0)])
    assert own.outcome is AttemptOutcome.failed and own.stop_workers and executor_decide.stop_after_end(own, None)
    assert executor_decide.stop_reason(own, None).startswith("stopped: worker 2 exited 1")
    unfit = decide([st(2, exit_code=None, phase="preflight", preflight_error="x")], now_s=0)
    assert not executor_decide.stop_after_end(unfit, None)  # nothing was launched
    logs_lost = decide([st(2, tail=BUSY, log_error="could not be written to gs://b: 403")])
    assert logs_lost.stop_workers  # kept through the detail's log warning
