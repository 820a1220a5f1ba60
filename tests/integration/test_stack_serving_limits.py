"""The local stack runs each service as deploy sets it on Cloud Run: its container's threads and its front's
request timeout and concurrency come from infra/services.yaml (tpuq.deploy.infra), nowhere else."""

from __future__ import annotations

from pathlib import Path

from tpuq_dev.devstack.front import FrontConfig


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)


def test_each_service_serves_as_many_requests_at_once_as_its_front_sends_it(stack):
    _target, infra = stack.deployment()
    routes = {r.service: r for r in FrontConfig.read(stack.state_dir / "front.json").routes}
    assert set(routes) == set(stack.services)
    for name in stack.services:
        spec = infra.services.service(name)
        route = routes[name]
        assert (route.limits.timeout_seconds, route.limits.concurrency, route.limits.max_instances) == (
            infra.request_timeout_seconds(name), spec.concurrency, spec.max_instances), name
        process = next(r for r in stack.records if r.name == name)
        env = _environ(process.pid)  # functions-framework's gunicorn reads THREADS and WORKERS at start
        assert (env.get("THREADS"), env.get("WORKERS")) == (str(spec.concurrency), "1"), name
