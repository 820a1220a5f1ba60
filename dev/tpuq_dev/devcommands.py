"""`tpuq dev preempt|unhealthy|dirty JOB`: what happens to a TPU VM in Google Cloud, done to a job's slice on the
local stack's fake Cloud TPU (its /_fake/ control endpoints, tpuq_dev.faketpu.control).

- preempt: the spot preemption, notice first: every worker's metadata server says `instance/preempted` TRUE and
  `instance/maintenance-event` TERMINATE_ON_HOST_MAINTENANCE for `--notice` seconds (30 by default, a spot VM's
  notice: production-facts.md "Spot TPU preemption notice"), then the hosts stop and the node is PREEMPTED.
- unhealthy: the node reports an unhealthy `health` from now on; its hosts keep running.
- dirty: a process on one worker holds a TPU device open (/dev/vfio/0), as a previous job's leftover does.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import typer

from tpuq.cli.console import CliError, out
from tpuq.contracts.documents import TpuHealth
from tpuq_dev.notifycommand import dev_notifications  # `tpuq dev notifications`: the webhook receiver's log

DEFAULT_NOTICE_SECONDS = 30.0  # a spot VM's: Compute Engine gives ~30 s between the notice and the stop
HEALTH_CHOICES = tuple(h.value for h in TpuHealth if h is not TpuHealth.HEALTHY)  # tpu.v2 Node.Health


def slice_node(job, slice_index: int) -> str:
    """The node of the job's slice `slice_index` (a multislice job's gang, in slice order; else its one node), or a
    CliError naming --slice."""
    nodes = list(job.gang) or [job.tpu]
    if not 0 <= slice_index < len(nodes):
        runs = f"runs on {len(nodes)} slices, 0-{len(nodes) - 1}" if len(nodes) > 1 else "runs on one slice, 0"
        raise CliError(f"--slice {slice_index}: job {job.id} {runs}")
    return nodes[slice_index]


def check_on_its_slice(job, command: str) -> None:
    """A CliError unless `tpuq dev <command>` may act on the job's slice: one the job holds now (assigned or
    running). `dirty` also takes an ended job's last slice, the one its leftover would be on; preempt and unhealthy
    would strike whatever job runs there now (an ended job's slice goes to the next job), so they refuse it."""
    from tpuq.contracts.documents import JOB_STATES_ON_A_TPU

    if job.state in JOB_STATES_ON_A_TPU and job.tpu:
        return
    if job.state.terminal and job.tpu:
        if command == "dirty":
            return
        raise CliError(f"job {job.id} has ended ({job.state.value}): its last slice may run another job now; "
                       f"`tpuq dev {command}` acts on the slice of a job that is assigned or running")
    raise CliError(f"job {job.id} is {job.state.value}: it is on no TPU slice now")


SLICE_HELP = "Which slice of a multislice job (0 first; its node `<request>-<slice>`)"


def _job_slice(job_id: str, command: str, slice_index: int = 0):
    """(control, node name, job) of the job's slice on the local stack, or a CliError saying why not."""
    from tpuq.cli.connecting import cli_clients, job_or_fail
    from tpuq.contracts.documents import JobDoc
    from tpuq_dev.faketpu.control import FakeTpuControl

    clients = cli_clients()
    endpoint = clients.settings.tpu_endpoint
    if not endpoint or not clients.settings.firestore_emulator:
        raise CliError(f"`tpuq dev {command}` acts on the local stack's fake Cloud TPU, and none is in use: start "
                       "one with `tpuq dev up` (then `eval \"$(tpuq dev env)\"`)")
    job = JobDoc.from_doc(job_or_fail(clients.firestore, job_id), job_id)
    check_on_its_slice(job, command)
    return FakeTpuControl(endpoint), slice_node(job, slice_index), job


def _short(node_name: str) -> str:
    from tpuq.operations.sshaccess import short_node_name

    return short_node_name(node_name)


def _control_call(call, node: str):
    from tpuq_dev.faketpu.control import FakeTpuControlError

    try:
        return call()
    except FakeTpuControlError as e:
        if e.status == 404:
            raise CliError(f"{_short(node)} is gone (deleted since): nothing to act on") from None
        raise CliError(f"the fake Cloud TPU refused: {e.message}") from None


def dev_preempt(job_id: str = typer.Argument(..., metavar="JOB"),
                notice: float = typer.Option(DEFAULT_NOTICE_SECONDS, "--notice", min=0.0,
                                             help="Seconds between the notice (the workers' metadata server says "
                                                  "preempted) and the stop; 0: stop now"),
                slice_index: int = typer.Option(0, "--slice", min=0, help=SLICE_HELP)) -> None:
    """Preempt the job's slice on the local stack, as Google preempts a spot TPU: the notice, then the stop."""
    control, node, _ = _job_slice(job_id, "preempt", slice_index)
    _control_call(lambda: control.preempt(node, notice=notice), node)
    if notice:
        stops = datetime.now(timezone.utc) + timedelta(seconds=notice)
        out.print(f"preemption notice on {_short(node)} (job {job_id}): its workers' metadata server says "
                  f"instance/preempted TRUE and maintenance-event TERMINATE_ON_HOST_MAINTENANCE; the hosts stop and "
                  f"the node goes PREEMPTED at {stops:%H:%M:%S} UTC (in {notice:g} s)", highlight=False, markup=False)
    else:
        out.print(f"preempted {_short(node)} (job {job_id}) with no notice: its hosts are stopped and the node is "
                  "PREEMPTED", highlight=False, markup=False)


def dev_unhealthy(job_id: str = typer.Argument(..., metavar="JOB"),
                  health: str = typer.Option(TpuHealth.UNHEALTHY_TENSORFLOW.value, "--health",
                                             help=f"The node's health from now on: {', '.join(HEALTH_CHOICES)}"),
                  symptom: str = typer.Option(None, "--symptom",
                                              help="A symptom on worker 0 too, e.g. HBM_OUT_OF_MEMORY"),
                  slice_index: int = typer.Option(0, "--slice", min=0, help=SLICE_HELP)) -> None:
    """Make the job's slice report itself unhealthy on the local stack (its hosts keep running)."""
    if health not in HEALTH_CHOICES:
        raise CliError(f"--health {health}: expected one of {', '.join(HEALTH_CHOICES)}")
    control, node, _ = _job_slice(job_id, "unhealthy", slice_index)
    _control_call(lambda: control.set_health(node, health, description="set by tpuq dev unhealthy",
                                             symptom=symptom), node)
    out.print(f"{_short(node)} (job {job_id}) now reports health {health}" + (f" ({symptom} on worker 0)" if symptom
              else "") + "; its hosts keep running", highlight=False, markup=False)


def dev_dirty(job_id: str = typer.Argument(..., metavar="JOB"),
              worker: int = typer.Option(0, "--worker", min=0, help="Which worker of the slice (0 first)"),
              slice_index: int = typer.Option(0, "--slice", min=0, help=SLICE_HELP),
              device: str = typer.Option("/dev/vfio/0", "--device", help="The device file to hold open")) -> None:
    """Leave a process holding a TPU device open on one worker of the job's slice, as a stuck earlier job does."""
    from tpuq.operations.sshaccess import SshRefused, check_worker

    control, node, _ = _job_slice(job_id, "dirty", slice_index)
    hosts = _control_call(lambda: control.node_info(node), node)["hosts"]
    try:
        check_worker(job_id, worker, len(hosts))
    except SshRefused as e:
        raise CliError(str(e)) from None
    held = _control_call(lambda: control.hold_device(node, worker, device), node)
    out.print(f"worker {worker} of {_short(node)} (job {job_id}): process {held['pid']} (user {held['user']}) holds "
              f"{held['device']} open; it lives until the host stops", highlight=False, markup=False)


COMMANDS = (("preempt", dev_preempt), ("unhealthy", dev_unhealthy), ("dirty", dev_dirty),
            ("notifications", dev_notifications))
