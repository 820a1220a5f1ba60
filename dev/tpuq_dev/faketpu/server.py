"""FakeTpuServer: the fake Cloud TPU API in a thread, plus the worker hosts of its ACTIVE nodes.

    server = FakeTpuServer("scenario.yaml", time_scale=600, state_dir=tmp)
    url = server.start()          # "http://127.0.0.1:PORT"
    ...
    server.stop()                 # also at exit: no sshd or worker process survives

A background thread advances the world every `tick_seconds` (so requests turn
ACTIVE with nobody polling), starts the hosts of nodes whose provisioning is
done and stops the hosts of nodes that are preempted or deleted. Host stops
also happen synchronously after every API or control call that changes state,
so "after preemption the connection is refused" holds as soon as the call returns.

`preempt_with_notice(node, seconds)` first turns every host's metadata server to
preempted TRUE / TERMINATE_ON_HOST_MAINTENANCE, and preempts the node `seconds` (real
seconds: the job's clock, not the scenario's) later, as Compute Engine warns a spot VM.
"""

from __future__ import annotations

import atexit
import logging
import random
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from werkzeug.serving import WSGIRequestHandler, make_server

from .api import CallLog, create_app
from .faults import FaultLayer
from tpuq_dev.capacitymodel.clock import Clock, ScaledClock
from .googleapis import create_google_apis_app
from .hosts import WorkerHost, WorkerHostError, WorkerHostManager, parse_ssh_keys_metadata
from .holders import DEFAULT_DEVICE, hold_device
from .metadata import InstanceMetadata
from .slices import publish_tpu_env
from tpuq_dev.capacitymodel.model import TPU_RUNTIME_PORT, Endpoint, FakeTpuWorld, GuestAttribute, NodeRecord
from tpuq_dev.capacitymodel.scenario import Scenario, load_scenario, parse_scenario

log = logging.getLogger(__name__)
HOST_KEYS_NAMESPACE = "hostkeys"  # the guest agent writes hostkeys/<algorithm> = <base64 public key>

_live_servers: weakref.WeakSet[FakeTpuServer] = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for server in list(_live_servers):
        server.stop()


atexit.register(_stop_all_at_exit)


class _QuietRequestHandler(WSGIRequestHandler):
    """No per-request lines on stderr: the call log (/_fake/calls) is the record."""

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


def lenient_ssh_keys(text: str) -> dict[str, list[str]]:
    """Like the guest agent on a TPU VM: skip malformed ssh-keys lines instead of failing the node."""
    keys: dict[str, list[str]] = {}
    for line in (text or "").splitlines():
        try:
            for user, user_keys in parse_ssh_keys_metadata(line).items():
                keys.setdefault(user, []).extend(user_keys)
        except ValueError as e:
            log.warning("ignoring ssh-keys line: %s", e)
    return keys


class FakeTpuServer:
    def __init__(
        self,
        scenario: Scenario | dict | str | Path | None = None,
        time_scale: float = 1.0,
        state_dir: str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        worker_hosts: bool = True,
        tick_seconds: float = 0.02,
        ssh_reachable: str | None = None,
        google_apis_port: int = 0,
        host_env: dict[str, str] | None = None,
    ) -> None:
        """ssh_reachable: "internal" | "external" overrides the scenario's network.ssh_reachable.

        google_apis_port: where the Cloud Quotas and Cloud Billing stand-ins listen (`google_apis_url`).
        host_env: set in every SSH session on the worker hosts (sshd SetEnv), e.g. where Cloud Storage is."""
        if isinstance(scenario, Scenario):
            self.scenario = scenario
        elif isinstance(scenario, dict):
            self.scenario = parse_scenario(scenario)
        else:
            self.scenario = load_scenario(scenario)
        self.ssh_reachable = ssh_reachable or self.scenario.network.ssh_reachable
        if self.ssh_reachable not in ("internal", "external"):
            raise ValueError(f"ssh_reachable must be 'internal' or 'external', not {self.ssh_reachable!r}")
        self.clock = clock or ScaledClock(time_scale)
        self._own_state_dir = state_dir is None
        self.state_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="faketpu-"))
        self.world = FakeTpuWorld(self.scenario, self.clock, rng, hosts_required=worker_hosts)
        self.worker_hosts = worker_hosts
        self.host_manager = WorkerHostManager(self.state_dir / "hosts")
        self.call_log = CallLog()
        self.fault_layer = FaultLayer()  # the chaos weather on the REST API (faults.py), off until set
        self.google_apis_call_log = CallLog()  # Cloud Quotas and Cloud Billing calls, apart from the TPU API's
        self._bind = (host, port)
        self._google_apis_port = google_apis_port
        self._google_http = None
        self.google_apis_url: str | None = None
        self._tick_seconds = tick_seconds
        self._hosts: dict[str, list[WorkerHost]] = {}  # node name -> its running hosts
        self._starting: set[str] = set()
        self._hosts_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._http = None
        self._threads: list[threading.Thread] = []
        self._starter = ThreadPoolExecutor(max_workers=4, thread_name_prefix="faketpu-hosts")
        self.host_env = dict(host_env or {})
        self._notices: list[threading.Timer] = []
        self.url: str | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> str:
        app = create_app(
            self.world,
            self.call_log,
            after_change=self.stop_unwanted_hosts,
            host_info=self.host_info,
            fault_layer=self.fault_layer,
            preempt_with_notice=self.preempt_with_notice,
            hold_device=self.hold_device,
        )
        self._http = make_server(
            self._bind[0], self._bind[1], app, threaded=True, request_handler=_QuietRequestHandler
        )
        host, port = self._http.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._google_http = make_server(
            self._bind[0], self._google_apis_port, create_google_apis_app(self.world, self.google_apis_call_log),
            threaded=True, request_handler=_QuietRequestHandler,
        )
        ghost, gport = self._google_http.server_address[:2]
        self.google_apis_url = f"http://{ghost}:{gport}"
        _live_servers.add(self)
        serve = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, name="faketpu-http", daemon=True
        )
        serve_google = threading.Thread(target=self._google_http.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="faketpu-googleapis-http", daemon=True)
        ticker = threading.Thread(target=self._tick_loop, name="faketpu-ticker", daemon=True)
        self._threads = [serve, serve_google, ticker]
        for t in self._threads:
            t.start()
        return self.url

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        for timer in self._notices:
            timer.cancel()
        for http in (self._http, self._google_http):
            if http is not None:
                http.shutdown()
                http.server_close()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=10)
        self._starter.shutdown(wait=True)
        with self._hosts_lock:
            self._hosts.clear()
        self.host_manager.stop_all()
        _live_servers.discard(self)

    def __enter__(self) -> FakeTpuServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- hosts -------------------------------------------------------------------------

    def _tick_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_hosts()
            except Exception:  # never let the ticker die: the fake would silently freeze
                log.exception("faketpu tick failed")
            self._wake.wait(self._tick_seconds)
            self._wake.clear()

    def sync_hosts(self) -> None:
        """Start hosts for nodes done provisioning, stop those of preempted/deleted nodes."""
        awaiting = self.world.nodes_awaiting_hosts()
        self.stop_unwanted_hosts()
        for node in awaiting:
            with self._hosts_lock:
                if node.name in self._starting or node.name in self._hosts or self._stop.is_set():
                    continue
                self._starting.add(node.name)
            try:
                self._starter.submit(self._start_node_hosts, node)
            except RuntimeError:  # shutting down
                with self._hosts_lock:
                    self._starting.discard(node.name)

    def _start_node_hosts(self, node: NodeRecord) -> None:
        try:
            hosts = self.host_manager.start_hosts(
                node.accelerator.hosts, lenient_ssh_keys(node.ssh_keys), label=f"{node.zone}-{node.node_id}",
                external_ips=node.enable_external_ips, listen_on=self.ssh_reachable, env=self.host_env,
                devices=max(1, node.accelerator.chips // node.accelerator.hosts), metadata=instance_metadata(node),
            )
        except Exception as e:
            log.exception("starting hosts of %s failed", node.name)
            self.world.hosts_failed(node.name, str(e))
            with self._hosts_lock:
                self._starting.discard(node.name)
            return
        # As the API reports them: the internal address, the external one only when asked for, port 8470.
        endpoints = tuple(Endpoint(h.internal_address, TPU_RUNTIME_PORT, h.external_address) for h in hosts)
        published = tuple(
            tuple(GuestAttribute(HOST_KEYS_NAMESPACE, algorithm, b64) for algorithm, b64 in h.host_keys().items())
            for h in hosts
        )
        with self._hosts_lock:
            self._starting.discard(node.name)
            self._hosts[node.name] = hosts
        publish_tpu_env(self.world, self.hosts_of, node)  # multislice: once every slice's hosts run, before ACTIVE
        if self._stop.is_set() or not self.world.hosts_started(node.name, endpoints, published):
            self.stop_unwanted_hosts()

    def stop_unwanted_hosts(self) -> None:
        wanted = self.world.node_names_wanting_hosts()
        with self._hosts_lock:
            doomed = [name for name in self._hosts if name not in wanted]
            to_stop = [h for name in doomed for h in self._hosts.pop(name)]
        if to_stop:
            self.host_manager.stop_hosts(to_stop)

    def preempt_with_notice(self, node_name: str, notice_seconds: float) -> None:
        """The notice now on every host of the node (its metadata servers), the preemption `notice_seconds` later.
        The node must be READY now; if it is not READY when the notice ends (deleted meanwhile), nothing more."""
        for host in self.hosts_of(node_name):
            host.metadata.give_preemption_notice()
        project, zone, node_id = _node_parts(node_name)

        def preempt() -> None:
            try:
                self.world.preempt_node(project, zone, node_id)
            except Exception as e:  # noqa: BLE001 - deleted or preempted during the notice: nothing left to do
                log.info("preemption of %s after its notice not done: %s", node_name, e)
            self.stop_unwanted_hosts()

        timer = threading.Timer(notice_seconds, preempt)
        timer.daemon = True
        self._notices = [t for t in self._notices if t.is_alive()] + [timer]
        timer.start()

    def hold_device(self, node_name: str, worker: int, device: str = DEFAULT_DEVICE) -> dict:
        """A detached process on that worker holding `device` open (holders.py); ValueError for a worker the node
        has not running."""
        hosts = self.hosts_of(node_name)
        if not 0 <= worker < len(hosts):
            raise ValueError(f"worker {worker}: {node_name} has {len(hosts)} running worker host(s)")
        try:
            return hold_device(hosts[worker], device)
        except WorkerHostError as e:  # e.g. no such device file on the host
            raise ValueError(str(e)) from None

    def hosts_of(self, node_name: str) -> list[WorkerHost]:
        with self._hosts_lock:
            return list(self._hosts.get(node_name, []))

    def host_info(self, node_name: str) -> list[dict]:
        return [
            {
                "worker": h.worker_index,
                "address": h.address,
                "port": h.port,
                "internal_address": h.internal_address,
                "external_address": h.external_address,
                "root_dir": str(h.root_dir),
                "tmp_dir": str(h.root_dir / "tmp"),
                "home_dirs": {u: str(h.root_dir / "home" / u) for u in h.users},
                "unshare_pid": h.unshare_pid,
                "init_pid": h.init_pid,
                "pids": h.namespace_pids(),
            }
            for h in self.hosts_of(node_name)
        ]


def _node_parts(node_name: str) -> tuple[str, str, str]:
    parts = node_name.split("/")  # projects/P/locations/Z/nodes/N
    return parts[1], parts[3], parts[5]


def instance_metadata(node: NodeRecord) -> list[InstanceMetadata]:
    """What each worker's metadata server says: the node's metadata (as created) and the attributes a TPU VM adds."""
    given = {str(k): str(v) for k, v in (node.spec.get("metadata") or {}).items()}
    return [InstanceMetadata(project_id=node.project,
                             attributes={**given, "accelerator-type": node.accelerator.name,
                                         "agent-worker-number": str(worker)})
            for worker in range(node.accelerator.hosts)]
