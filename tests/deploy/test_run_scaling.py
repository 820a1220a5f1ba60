"""Cloud Run's scaling and CPU allocation in the deployed service bodies: what infra/services.yaml says is sent.

run v2 documents `cpuIdle` as "true by default. However, if ResourceRequirements is set, the caller must
explicitly set this field to true to preserve the default behavior": every body sets resources, so every body
must say cpuIdle, or each service would be billed for CPU outside requests."""

from __future__ import annotations

import copy
import dataclasses

import yaml

from tpuq.deploy.infra import load_infra
from tpuq.deploy.plan import Target, desired_run_service, run_projection
from tpuq.operations.examples import EXAMPLE_FLEET
from tpuq.contracts.fleet import FleetFile

SERVICES = ("scheduler", "claimer", "executor", "janitor")


def target() -> Target:
    fleet = FleetFile.model_validate({**yaml.safe_load(EXAMPLE_FLEET), "ssh_key_secret": "tpuq-ssh"})
    return Target(fleet=fleet, region="us-central1", project_number="42")


def test_by_default_every_service_scales_to_zero_with_cpu_only_during_requests():
    t = target()
    infra = load_infra(t.variables())
    for name in SERVICES:
        template = desired_run_service(t, infra, name)["template"]
        assert template["scaling"]["minInstanceCount"] == 0
        assert template["containers"][0]["resources"]["cpuIdle"] is True


def test_a_warm_executor_keeps_one_instance_with_cpu_always_allocated():
    t = target()
    infra = load_infra(t.variables())
    warm = dataclasses.replace(infra, services=infra.services.model_copy(update={"services": [
        s.model_copy(update={"min_instances": 1, "cpu_always_allocated": True}) if s.name == "executor" else s
        for s in infra.services.services]}))
    body = desired_run_service(t, warm, "executor")
    assert body["template"]["scaling"]["minInstanceCount"] == 1
    assert body["template"]["containers"][0]["resources"]["cpuIdle"] is False
    # A deployed service that differs only in these is updated by the next deploy.
    assert run_projection(body) != run_projection(desired_run_service(t, infra, "executor"))


def test_each_push_services_container_serves_as_many_requests_at_once_as_cloud_run_sends_it():
    """Cloud Run sends an instance up to `maxInstanceRequestConcurrency` requests; functions-framework's gunicorn
    serves THREADS at once (4 × CPUs by default: 4 on 1 vCPU), and the rest waited inside the container, their
    time counting against Pub/Sub's ack deadline (issue 32: long SSH starts queued gcs-events and ticks)."""
    t = target()
    infra = load_infra(t.variables())
    for name in SERVICES:
        template = desired_run_service(t, infra, name)["template"]
        env = {e["name"]: e["value"] for e in template["containers"][0]["env"]}
        assert env["THREADS"] == str(template["maxInstanceRequestConcurrency"]) == str(
            infra.services.service(name).concurrency), name
        assert env["WORKERS"] == "1", name
    # A deployed service still on gunicorn's default threads is updated by the next deploy.
    body = desired_run_service(t, infra, "executor")
    stale = copy.deepcopy(body)
    stale["template"]["containers"][0]["env"] = [e for e in stale["template"]["containers"][0]["env"]
                                                 if e["name"] not in ("THREADS", "WORKERS")]
    assert run_projection(stale) != run_projection(body)


def test_functions_framework_reads_the_threads_and_workers_deploy_sets(monkeypatch):
    """The names are functions-framework's (its _http/gunicorn.py): an upgrade that renamed them would silently
    bring back 4 × CPUs threads."""
    from functions_framework._http.gunicorn import GunicornApplication

    monkeypatch.setenv("THREADS", "20")
    monkeypatch.setenv("WORKERS", "1")
    app = GunicornApplication(object(), "127.0.0.1", 0, False)
    assert app.cfg.threads == 20 and app.cfg.workers == 1
