"""FakeTpuControl: a small client for the fake Cloud TPU's /_fake/ control endpoints.

    control = FakeTpuControl(url)
    control.preempt("projects/p/locations/us-central2-b/nodes/n1")
    control.set_stockout("us-central2-b", "v4", True)
    control.calls(method="GET")   # the witness: every API call made to the fake
"""

from __future__ import annotations

from typing import Any

import requests


class FakeTpuControlError(RuntimeError):
    """A control call the fake refused: `status` its HTTP status, `message` what it said."""

    def __init__(self, text: str, status: int = 0, message: str = "") -> None:
        super().__init__(text)
        self.status, self.message = status, message or text


class FakeTpuControl:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session = requests.Session()

    def _call(self, method: str, path: str, **kwargs: Any) -> dict:
        response = self._session.request(method, f"{self.url}/_fake/{path}", timeout=self.timeout, **kwargs)
        try:
            body = response.json()
        except ValueError:
            body = {"error": {"message": response.text}}
        if response.status_code >= 400:
            message = (body.get("error") or {}).get("message", response.text)
            raise FakeTpuControlError(f"{method} /_fake/{path} -> {response.status_code}: {message}",
                                      response.status_code, message)
        return body

    def health(self) -> dict:
        return self._call("GET", "health")

    def preempt(self, node_name: str, notice: float = 0) -> dict:
        """Preempt an ACTIVE node: node PREEMPTED, its hosts killed, request SUSPENDING -> SUSPENDED. With `notice`
        (real seconds), every host's metadata server first says preempted TRUE and maintenance-event
        TERMINATE_ON_HOST_MAINTENANCE, and the preemption follows that long after; the call returns at once."""
        return self._call("POST", "preempt", json={"name": node_name, "notice": notice})

    def hold_device(self, node_name: str, worker: int, device: str = "/dev/vfio/0") -> dict:
        """Start a detached process on that worker host holding `device` open, as its login user (a previous job's
        leftover); it lives until the host stops. Returns {"worker", "device", "pid" (as the host sees it), "user"}."""
        return self._call("POST", "hold", json={"name": node_name, "worker": worker, "device": device})

    def set_health(self, node_name: str, health: str, *, description: str | None = None,
                   symptom: str | None = None, details: str | None = None, worker: int = 0) -> dict:
        """A READY node reports `health` from now on (tpu.v2 Node.health: HEALTHY, TIMEOUT, UNHEALTHY_TENSORFLOW,
        UNHEALTHY_MAINTENANCE), with an optional healthDescription and a symptom (tpu.v2 Symptom.symptomType, e.g.
        HBM_OUT_OF_MEMORY) on `worker`. Its hosts keep running. Returns the node as the API renders it."""
        return self._call("POST", "health", json={"name": node_name, "health": health, "description": description,
                                                   "symptom": symptom, "details": details, "worker": worker})

    def schedule_maintenance(self, node_name: str, starts_in: float | None, *, duration: float = 3600,
                             type: str | None = None, can_reschedule: bool = True) -> dict:
        """A maintenance notice on a READY node (upcomingMaintenance, PENDING): the window opens `starts_in`
        scenario seconds from now and lasts `duration`, during which the node is UNHEALTHY_MAINTENANCE. None takes
        the notice back. `type`: SCHEDULED (the default) or UNSCHEDULED."""
        return self._call("POST", "maintenance", json={"name": node_name, "starts_in": starts_in,
                                                        "duration": duration, "type": type,
                                                        "can_reschedule": can_reschedule})

    def fail(self, queued_resource_name: str, error_class: str) -> dict:
        """Fail a queued resource now with a real error of that class (errors.ERROR_CLASSES): capacity|quota|reserved|
        billing|permission|external_ips|expired|unknown."""
        return self._call("POST", "fail", json={"name": queued_resource_name, "error_class": error_class})

    def inject_fault(
        self,
        status: str = "UNAVAILABLE",
        *,
        message: str | None = None,
        method: str | None = None,
        path_contains: str | None = None,
        count: int = 1,
        error_class: str | None = None,
    ) -> None:
        """Fail the next `count` matching API calls with an HTTP error of that canonical status; or, with
        `error_class` (see errors.ERROR_CLASSES), with that class's real refusal for the call's project and zone,
        its details included (quota: the real 429 with a google.rpc.QuotaFailure)."""
        self._call(
            "POST",
            "faults",
            json={"status": status, "message": message, "method": method, "path_contains": path_contains, "count": count,
                  "error_class": error_class},
        )

    def set_chaos(self, seed: int = 0, *, unavailable: float = 0.0, timeout: float = 0.0, hang_seconds: float = 20.0,
                  spike: float = 0.0, spike_max_seconds: float = 5.0) -> dict:
        """Random faults on every REST call from now on, drawn from `seed` (faults.py): a share answered 503
        UNAVAILABLE, a share that hangs `hang_seconds` then answers 504 (half of them done first), and a share
        delayed up to `spike_max_seconds`. All zero (the default) turns it off. Restarts the counts."""
        return self._call("POST", "chaos", json={"seed": seed, "unavailable": unavailable, "timeout": timeout,
                                                 "hang_seconds": hang_seconds, "spike": spike,
                                                 "spike_max_seconds": spike_max_seconds})

    def chaos(self) -> dict:
        """{"weather": {...}, "injected": {"unavailable": n, "timeout": n, "latency_spike": n}}."""
        return self._call("GET", "chaos")

    def set_stockout(self, zone: str, family: str | None, stockout: bool | None, effect: str = "fail") -> None:
        """True: no capacity (effect fail|wait); False: capacity whatever the scenario; None: back to the scenario."""
        self._call("POST", "capacity", json={"zone": zone, "family": family, "stockout": stockout, "effect": effect})

    def set_billing(self, enabled: bool | None, project: str | None = None) -> None:
        """Enable/disable billing for one project (or all); None: back to the scenario."""
        self._call("POST", "billing", json={"project": project, "enabled": enabled})

    def set_firewalls(self, project: str, firewalls: list[dict] | None, permission_denied: bool = False) -> dict:
        """On the Google APIs URL: the project's VPC firewall rules (compute v1 field names) that its
        `firewalls.list` reports; None: back to the scenario's `network.firewalls`. permission_denied: reads
        of them answer 403, as for a caller without compute.firewalls.list."""
        return self._call("POST", "firewalls", json={"project": project, "firewalls": firewalls,
                                                     "permission_denied": permission_denied})

    def set_subnetworks(self, project: str, subnetworks: list[dict] | None, auto_mode_networks: list[str] | None = None,
                        permission_denied: bool = False) -> dict:
        """On the Google APIs URL: the project's VPC subnets (compute v1 field names: name, region, network,
        ipCidrRange) and its auto-mode networks, which compute `subnetworks.get`/`.list` report and a TPU create's
        networkConfig must name in the node's region; None for both: back to the scenario's. permission_denied:
        reads of them answer 403."""
        return self._call("POST", "subnetworks", json={"project": project, "subnetworks": subnetworks,
                                                       "auto_mode_networks": auto_mode_networks,
                                                       "permission_denied": permission_denied})

    def calls(self, method: str | None = None, path_contains: str | None = None) -> list[dict]:
        """The API call log (method, path, query, args, body, time, scenario_time, status), optionally filtered."""
        calls = self._call("GET", "calls")["calls"]
        return [
            c
            for c in calls
            if (method is None or c["method"] == method.upper()) and (path_contains is None or path_contains in c["path"])
        ]

    def clear_calls(self) -> None:
        self._call("DELETE", "calls")

    def node_info(self, node_name: str) -> dict:
        """{"node": <as the API renders it>, "hosts": [{worker, address, port, root_dir, tmp_dir, home_dirs, pids...}]}."""
        return self._call("GET", "node", params={"name": node_name})

    def quota(self, project: str, zone: str, family: str, tier: str) -> dict:
        """{"used": chips held, "limit": chips} for tier spot|on_demand."""
        return self._call("GET", "quota", params={"project": project, "zone": zone, "family": family, "tier": tier})
