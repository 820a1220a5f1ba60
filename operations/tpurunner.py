"""tpu-runner's deployment.yaml, read as a tpuq fleet file (issue 15 §1).

tpu-runner (PyPI `tpu-runner`, schema of 0.1.12: `tpu_runner/specs.py`,
`fleet_spec_from_dict`) is what most tpuq users ran before. Its deployment
file is accepted unchanged: `read_fleet` tells the two kinds apart and maps a
tpu-runner file onto `FleetFile`, with tpu-runner's meaning for each field:

- `controller_region`, `controller_timeout`, `controller_memory`,
  `controller_max_retries`: accepted; tpuq has no controller (the services
  react to events), and `tpuq validate` says so in one line.
- `bucket`: the runner bucket (`runner_bucket`).
- `firestore_location`, `network`, `subnetwork`: the same-named fleet fields
  (deploy's Firestore database; the nodes' network and the executor's egress).
- `ssh_transport`: iap or direct, default direct (tpu-runner's default; tpuq's
  own files default to vpc). iap follows tpuq's iap rule (`SshTransport`).
- `tpus[].chip_limit`: required, and caps the chips of one (provisioning model,
  family, zone) across all entries. That is tpuq's `quota` section, which the
  claimer enforces on every create, so a tpu-runner file becomes a fleet whose
  `quota` is built from its chip_limits. (In tpuq's own files chip_limit is an
  optional per-entry cap.)
- `tpus[].id`: optional; when absent, tpu-runner's derived id
  `<type>-<zone>-<index>`.
- `tpus[].existing`: tpuq's `existing:` (a node tpuq uses but never creates,
  changes or deletes). Its chip_limit is checked like any other entry's but
  adds no quota: tpuq claims nothing for it.

A tpu-runner file is recognised by a field only tpu-runner has (every file
tpu-runner accepts has `controller_region`, which it requires). tpuq's own
fields may be added to a tpu-runner file (e.g. `ssh_key_secret`), except the
two that would say the same thing twice: `quota` (chip_limit builds it) and
`runner_bucket` (that is `bucket`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tpuq.contracts.errors import Permanent
from tpuq.contracts.fleet import FleetFile

CONTROLLER_FIELDS = ("controller_region", "controller_timeout", "controller_memory", "controller_max_retries")
# Top-level fields only tpu-runner's files have: any one of them makes a file a tpu-runner file.
RUNNER_ONLY_FIELDS = frozenset({*CONTROLLER_FIELDS, "bucket"})
# Every field of tpu-runner 0.1.12's deployment file and of its tpus[] entries.
RUNNER_FIELDS = frozenset({
    "name", "project", *CONTROLLER_FIELDS, "firestore_location", "network", "subnetwork", "tpus", "bucket",
    "idle_timeout_seconds", "ssh_transport", "worker_secrets",
})
RUNNER_ENTRY_FIELDS = frozenset({
    "id", "type", "zone", "count", "existing", "runtime", "provisioning_model", "chip_limit", "keep_warm_count",
})
RUNNER_DEFAULT_TRANSPORT = "direct"

CONTROLLER_NOTE = (
    "{fields}: not needed: tpuq runs no controller loop to size, time out or retry; its four Cloud Run services "
    "react to Pub/Sub events and Cloud Run retries each delivery (the services' region is `tpuq deploy --region`)"
)

_SLUG_RE = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class FleetRead:
    """A fleet file as read: the fleet, which kind of file it was, and the lines `tpuq validate` prints."""

    fleet: FleetFile
    kind: str  # "tpuq" or "tpu-runner"
    notes: list[str] = field(default_factory=list)  # settings accepted that do nothing in tpuq, and why
    warnings: list[str] = field(default_factory=list)  # valid settings that may not do what the user expects


def is_runner_file(data: Any) -> bool:
    return isinstance(data, dict) and any(k in data for k in RUNNER_ONLY_FIELDS)


def read_fleet(data: Any) -> FleetRead:
    """A tpuq fleet file or a tpu-runner deployment file -> the fleet. Raises pydantic's ValidationError for
    field errors, and Permanent (naming the field) for the rules only a tpu-runner file has."""
    if not is_runner_file(data):
        fleet = FleetFile.model_validate(data)
        return FleetRead(fleet, "tpuq", warnings=fleet.transport_notes())
    mapped, limits, notes = _map_runner_file(data)
    fleet = FleetFile.model_validate(mapped)  # field errors first, with the file's own indices
    quota, warnings = _chip_limit_quota(fleet, limits)
    fleet = FleetFile.model_validate({**mapped, "quota": quota})
    return FleetRead(fleet, "tpu-runner", notes, warnings + fleet.transport_notes())


def _entry_label(raw: dict, index: int) -> str:
    return f"tpus[{raw['id']}]" if isinstance(raw.get("id"), str) and raw.get("id") else f"tpus[{index - 1}]"


def _slug(value: str) -> str:
    value = _SLUG_RE.sub("-", value.strip().lower().replace("_", "-"))
    return re.sub(r"-+", "-", value).strip("-") or "item"


def _map_runner_file(data: dict) -> tuple[dict, list[int], list[str]]:
    """The FleetFile mapping (chip_limits taken out, one per entry) and the notes."""
    for mine, theirs in (("quota", "each entry's chip_limit"), ("runner_bucket", "bucket")):
        if mine in data:
            raise Permanent(f"{mine}: a tpu-runner deployment file says this with {theirs}; give one, not both",
                            field=mine)
    mapped = {k: v for k, v in data.items() if k not in RUNNER_ONLY_FIELDS}
    notes = []
    given = [f for f in CONTROLLER_FIELDS if f in data]
    if given:
        notes.append(CONTROLLER_NOTE.format(fields=", ".join(given)))
    if data.get("bucket") is not None:
        bucket = str(data["bucket"]).rstrip("/")  # tpu-runner accepts a trailing slash
        mapped["runner_bucket"] = bucket
    transport = data.get("ssh_transport", RUNNER_DEFAULT_TRANSPORT)
    mapped["ssh_transport"] = transport.strip().lower() if isinstance(transport, str) else transport
    tpus = data.get("tpus")
    limits: list[int] = []
    if isinstance(tpus, list):
        entries = []
        for index, raw in enumerate(tpus, start=1):
            if not isinstance(raw, dict):
                entries.append(raw)  # FleetFile says what is wrong with it
                continue
            label = _entry_label(raw, index)
            entry = {k: v for k, v in raw.items() if k != "chip_limit"}
            if not entry.get("id") and isinstance(raw.get("type"), str) and isinstance(raw.get("zone"), str):
                entry["id"] = f"{_slug(raw['type'])}-{_slug(raw['zone'])}-{index}"  # tpu-runner's derived id
            limit = raw.get("chip_limit")
            if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
                raise Permanent(f"{label}.chip_limit: required in a tpu-runner deployment file, a positive "
                                "number of chips (it caps one provisioning model, family and zone across entries)",
                                field=f"{label}.chip_limit")
            limits.append(limit)
            entries.append(entry)
        mapped["tpus"] = entries
    return mapped, limits, notes


def _chip_limit_quota(fleet: FleetFile, limits: list[int]) -> tuple[dict, list[str]]:
    """tpu-runner's chip_limits as tpuq's quota section: zone -> family -> {spot|on_demand: chips}."""
    quota: dict[str, dict[str, dict[str, int]]] = {}
    given_by: dict[tuple[str, str, str], tuple[int, str]] = {}
    wanted: dict[tuple[str, str, str], int] = {}
    for entry, limit in zip(fleet.tpus, limits):
        if entry.existing:
            continue  # a node the user brought: nothing is claimed for it, so it needs no quota
        accel = entry.accelerator
        model = entry.provisioning_model.value
        for zone in entry.zones:
            key = (model, accel.family, zone)
            if key in given_by and given_by[key][0] != limit:
                other, where = given_by[key]
                raise Permanent(
                    f"tpus[{entry.id}].chip_limit: {limit} disagrees with the {other} of {where} for "
                    f"{model} {accel.family} in {zone}; one provisioning model, family and zone has one chip_limit",
                    field=f"tpus[{entry.id}].chip_limit")
            given_by.setdefault(key, (limit, f"tpus[{entry.id}]"))
            wanted[key] = wanted.get(key, 0) + entry.count * accel.chips
            quota.setdefault(zone, {}).setdefault(accel.family, {})[model] = limit
    warnings = [
        f"tpus: {model} {family} in {zone}: the entries' counts come to {wanted[(model, family, zone)]} chips, above "
        f"their chip_limit of {limit}; tpuq holds at most {limit} chips there at once"
        for (model, family, zone), (limit, _) in given_by.items() if wanted[(model, family, zone)] > limit
    ]
    return quota, warnings

