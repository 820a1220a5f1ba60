"""Every model: valid examples, each invalid field named with its reason, and a JSON round trip."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from tpuq.contracts import messages
from tpuq.contracts.errors import describe_validation_error
from tpuq.contracts.fleet import FleetFile, ProvisioningModel
from tpuq.contracts.jobspec import JobFile, JobSpec, PublishedJob
from tpuq.contracts.tputypes import parse_accelerator_type, zone_region

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)

TPU_RUNNER_JOB = {
    "jobs": [
        {
            "tpu": ["v4-32", "v6e-64"],
            "buckets": ["gs://my-training-us-central2", "gs://my-training-us-east1"],
            "bundle": ".",
            "priority": "high",
            "caches": [{"key": "pip", "path": ".cache/pip"}],
            "env": {"PIP_CACHE_DIR": ".cache/pip", "WANDB_PROJECT": "my-project"},
            "command": "python3 -m pip install -r requirements.txt && python3 train.py",
        }
    ]
}

TPU_RUNNER_FLEET = {
    "name": "research",
    "project": "my-project",
    "idle_timeout_seconds": 600,
    "ssh_transport": "direct",
    "worker_secrets": ["wandb-api-key"],
    "tpus": [
        {"id": "v4-pool", "type": "v4-32", "zone": "us-central2-b", "runtime": "tpu-ubuntu2204-base", "count": 2,
         "keep_warm_count": 1, "chip_limit": 32, "provisioning_model": "spot"},
        {"id": "v6e-pool", "type": "v6e-64", "zones": ["us-east1-d", "europe-west4-a"], "count": 1,
         "provisioning_model": "on-demand"},
    ],
}


def field_and_reason(model, data):
    with pytest.raises(ValidationError) as exc:
        model.model_validate(data)
    return describe_validation_error(exc.value)


# ---------------------------------------------------------------- tpu types
@pytest.mark.parametrize(
    "name,hosts,chips",
    [("v2-8", 1, 4), ("v3-8", 1, 4), ("v4-8", 1, 4), ("v4-32", 4, 16), ("v5litepod-8", 1, 8), ("v5e-8", 1, 8),
     ("v5litepod-64", 16, 64), ("v6e-64", 16, 64), ("v6e-256", 64, 256), ("v4-128", 16, 64), ("v5litepod-4", 1, 4)],
)
def test_command_matrix_hosts(name, hosts, chips):
    t = parse_accelerator_type(name)
    assert (t.hosts, t.chips) == (hosts, chips)
    assert t.needs_internal_ips == (hosts >= 16)


def test_zone_region():
    assert zone_region("us-central2-b") == "us-central2"
    with pytest.raises(ValueError):
        zone_region("uscentral")


# ---------------------------------------------------------------- job.yaml
def test_tpu_runner_job_file_is_accepted():
    jf = JobFile.model_validate(TPU_RUNNER_JOB)
    job = jf.jobs[0]
    assert job.tpu == ["v4-32", "v6e-64"]
    assert job.regions == {"us-central2", "us-east1"}
    assert job.bucket_for_region("us-east1") == "gs://my-training-us-east1"
    assert job.caches[0].path == ".cache/pip"


def test_single_job_at_top_level_and_aliases():
    jf = JobFile.model_validate({"tpu": "v5e-8", "command": "true"})
    assert jf.jobs[0].tpu == ["v5litepod-8"]


def test_job_json_round_trip():
    job = PublishedJob.model_validate({**TPU_RUNNER_JOB["jobs"][0], "bundle": "gs://my-training-us-central2/b/x.tar.gz",
                                       "id": "train-1", "zone": "us-central2-b"})
    again = PublishedJob.model_validate_json(job.model_dump_json())
    assert again == job


def test_explicit_bucket_region():
    job = JobSpec.model_validate({"tpu": "v4-8", "command": "x",
                                  "buckets": [{"uri": "gs://data", "region": "us-central2"}, "gs://other-europe-west4"]})
    assert job.regions == {"us-central2", "europe-west4"}


BAD_JOBS = [
    ({"tpu": "v4-8"}, "command", "required"),
    ({"tpu": "v4-8", "command": "   "}, "command", "empty"),
    ({"tpu": "v4-8", "command": "x", "priority": "urgent"}, "priority", "low"),
    ({"tpu": "v4-8", "command": "x", "env": {"JOB_ID": "1"}}, "env", "reserved"),
    ({"tpu": "v4-8", "command": "x", "env": {"TPU_WORKER_ID": "1"}}, "env", "reserved"),
    ({"tpu": "v4-8", "command": "x", "env": {"TPUQ_X": "1"}}, "env", "reserved"),
    ({"tpu": "v4-8", "command": "x", "env": {"1BAD": "1"}}, "env", "not a valid environment variable name"),
    ({"tpu": "v4-8", "command": "x", "env": {"A-B": "1"}}, "env", "not a valid"),
    ({"tpu": "v4-8", "command": "x", "buckets": ["s3://b"]}, "buckets[0].uri", "gs://"),
    ({"tpu": "v4-8", "command": "x", "buckets": ["gs://b-us-central2/path"]}, "buckets[0].uri", "without a path"),
    ({"tpu": "v4-8", "command": "x", "buckets": ["gs://a-us-central2", "gs://b-us-central2"]}, "buckets", "both in region"),
    ({"tpu": "v4-8", "command": "x", "caches": [{"key": "pip", "path": "/abs"}]}, "caches[0].path", "relative"),
    ({"tpu": "v4-8", "command": "x", "caches": [{"key": "pip", "path": "a/../../b"}]}, "caches[0].path", ".."),
    ({"tpu": "v4-8", "command": "x", "caches": [{"key": "a", "path": "x"}, {"key": "a", "path": "y"}]}, "caches", "twice"),
    ({"tpu": "v9-8", "command": "x"}, "tpu", "unknown TPU type"),
    ({"tpu": [], "command": "x"}, "tpu", "at least 1"),
    ({"tpu": "v4-8", "command": "x", "id": "Bad_ID"}, "id", "lowercase"),
    ({"tpu": "v4-8", "command": "x", "zone": "nowhere"}, "zone", "zone"),
    ({"tpu": "v4-8", "command": "x", "colour": "red"}, "colour", "unknown field"),
    ({"tpu": "v4-8", "command": "x", "max_preemptions": -1}, "max_preemptions", "greater than"),
    # Type errors as a person writing YAML reads them (the value given; what to type instead).
    ({"tpu": 8, "command": "x"}, "tpu", "a TPU type such as v4-8 or v5litepod-8, or a list of them: got 8"),
    ({"tpu": "v4-8", "command": "x", "env": {"N": 5}}, "env.N",
     "text expected, got 5 (YAML read a number): quote it as you wrote it"),
    ({"tpu": "v4-8", "command": "x", "priority": "High"}, "priority", "'low', 'normal' or 'high' expected, got 'High'"),
    ({"tpu": "v4-8", "command": "x", "env": {"F": True}}, "env.F", "got true (YAML read true or false: yes, no, on"),
    ({"tpu": "v4-8", "command": "x", "env": {"D": __import__("datetime").date(2026, 12, 5)}}, "env.D",
     "got a date (2026-12-05) (YAML read a date): quote it"),
    ({"tpu": "v4-8", "command": None}, "command", "text expected, got nothing"),
    ({"tpu": "v4-8", "command": ["python3", "a.py"]}, "command", "text expected, got a list (['python3', 'a.py'])"),
    ({"tpu": "v4-8", "command": "x", "max_preemptions": "three"}, "max_preemptions",
     "a whole number expected, got 'three'"),
]


@pytest.mark.parametrize("data,field,reason", BAD_JOBS)
def test_invalid_job_names_field_and_reason(data, field, reason):
    got_field, got_reason = field_and_reason(JobSpec, data)
    assert got_field == field
    assert reason.lower() in got_reason.lower()


def test_published_job_bundle_must_be_gs_object():
    f, r = field_and_reason(PublishedJob, {"tpu": "v4-8", "command": "x", "bundle": "./src"})
    assert f == "bundle" and "gs://" in r
    f, r = field_and_reason(PublishedJob, {"tpu": "v4-8", "command": "x", "bundle": "gs://bucket"})
    assert f == "bundle" and "object" in r


def test_job_file_duplicate_ids():
    f, r = field_and_reason(JobFile, {"jobs": [{"id": "a", "tpu": "v4-8", "command": "x"}] * 2})
    assert "used twice" in r


# ---------------------------------------------------------------- fleet
def test_tpu_runner_fleet_is_accepted():
    fleet = FleetFile.model_validate(TPU_RUNNER_FLEET)
    v4, v6e = fleet.tpus
    assert v4.zones == ["us-central2-b"] and v4.spot and v4.max_slices == 2
    assert v6e.provisioning_model is ProvisioningModel.on_demand
    assert v6e.runtime_version == "v2-alpha-tpuv6e"
    assert fleet.owner_prefix == "tpuq"
    assert fleet.zone_quota_chips("us-central2-b", "v4", ProvisioningModel.spot) is None  # not declared: not checked


def test_fleet_quota_retry_and_prefix():
    fleet = FleetFile.model_validate({
        **TPU_RUNNER_FLEET,
        "owner_prefix": "lab",
        "retry": {"preemptions": 5, "infra_failures": 1},
        "quota": {"us-central2-b": {"v4": {"spot": 64}}, "us-east1-d": {"v6e": {"on_demand": 64}}},
    })
    assert fleet.zone_quota_chips("us-central2-b", "v4", ProvisioningModel.spot) == 64
    assert fleet.zone_quota_chips("us-central2-b", "v4", ProvisioningModel.on_demand) == 0
    assert fleet.zone_quota_chips("europe-west4-a", "v6e", ProvisioningModel.on_demand) == 0
    assert fleet.retry.preemptions == 5
    assert FleetFile.model_validate_json(fleet.model_dump_json()) == fleet
    assert fleet.version != FleetFile.model_validate(TPU_RUNNER_FLEET).version


def test_chip_limit_caps_slices():
    fleet = FleetFile.model_validate({**TPU_RUNNER_FLEET, "tpus": [
        {"id": "p", "type": "v4-32", "zone": "us-central2-b", "count": 5, "chip_limit": 40}]})
    assert fleet.tpus[0].max_slices == 2


def _fleet_with(entry_changes=None, **top):
    data = {**TPU_RUNNER_FLEET, **top}
    if entry_changes is not None:
        data["tpus"] = [{**TPU_RUNNER_FLEET["tpus"][0], **entry_changes}]
    return data


BAD_FLEETS = [
    (_fleet_with(owner_prefix="Bad Prefix"), "owner_prefix", "lowercase"),
    (_fleet_with(name="x" * 40), "name", "lowercase"),
    (_fleet_with(tpus=[]), "tpus", "at least 1"),
    (_fleet_with({"type": "v4-33"}), "tpus[0].type", "unknown TPU type"),
    (_fleet_with({"zone": "central"}), "tpus[0].zones", "zone"),
    (_fleet_with({"keep_warm_count": 5}), "tpus[0]", "keep_warm_count"),
    (_fleet_with({"chip_limit": 8}), "tpus[0]", "below one"),
    (_fleet_with({"provisioning_model": "reserved"}), "tpus[0].provisioning_model", "spot"),
    (_fleet_with(worker_secrets=["sk-live abc/def"]), "worker_secrets", "names"),
    (_fleet_with(quota={"us-central2-b": {"v9": {"spot": 1}}}), "quota", "family"),
    (_fleet_with(quota={"us-central2-b": {"v4": {"spot": -1}}}), "quota.us-central2-b.v4.spot", "greater than"),
    (_fleet_with(retry={"preemptions": -1}), "retry.preemptions", "greater than"),
    (_fleet_with(ssh_transport="telnet"), "ssh_transport", "direct"),
    (_fleet_with(runner_bucket="gs://b/path"), "runner_bucket", "bucket"),
]


@pytest.mark.parametrize("data,field,reason", BAD_FLEETS)
def test_invalid_fleet_names_field_and_reason(data, field, reason):
    got_field, got_reason = field_and_reason(FleetFile, data)
    assert got_field == field
    assert reason.lower() in got_reason.lower()


# ---------------------------------------------------------------- messages
ENDPOINTS = [messages.WorkerEndpoint(worker_id=0, ip="127.0.1.1", port=22)]
VALID_MESSAGES = [
    messages.CapacityRequest(request_id="r-1", fleet="research", types=["v4-32"], regions=["us-central2"], count=2),
    messages.FleetEvent(kind="ACTIVE", fleet="research", queued_resource="projects/p/locations/z/queuedResources/q",
                        zone="us-central2-b", type="v4-32", node="projects/p/locations/z/nodes/n", chips=16, hosts=4,
                        endpoints=ENDPOINTS, at=NOW),
    messages.FleetEvent(kind="FAILED", fleet="research", queued_resource="q", zone="us-central2-b", type="v4-32",
                        failure_class="capacity", failure_message="no more capacity", at=NOW),
    messages.Assignment(job_id="j", attempt=1, attempt_id="j-1", node="n", zone="us-central2-b", endpoints=ENDPOINTS,
                        job=PublishedJob(tpu="v4-8", command="x"), at=NOW),
    messages.AttemptEvent(kind="ended", job_id="j", attempt=1, attempt_id="j-1", node="n", outcome="preempted", at=NOW),
    messages.Tick(at=NOW, seq=3),
    messages.CancelRequest(job_id="j"),
    messages.GcsObjectEvent(bucket="b", name="submit/job.yaml", generation="1"),
]


@pytest.mark.parametrize("msg", VALID_MESSAGES, ids=lambda m: type(m).__name__)
def test_message_json_round_trip(msg):
    assert type(msg).model_validate_json(msg.model_dump_json()) == msg


BAD_MESSAGES = [
    (messages.CapacityRequest, {"request_id": "R 1", "fleet": "f"}, "request_id"),
    (messages.CapacityRequest, {"request_id": "r", "fleet": "f", "count": -1}, "count"),
    (messages.CapacityRequest, {"request_id": "r", "fleet": "f", "action": "grab"}, "action"),
    (messages.FleetEvent, {"kind": "EXPLODED", "fleet": "f", "queued_resource": "q", "zone": "z", "type": "t",
                           "at": NOW.isoformat()}, "kind"),
    (messages.FleetEvent, {"kind": "ACTIVE", "fleet": "f", "queued_resource": "q", "zone": "z", "type": "t"}, "at"),
    (messages.Assignment, {"job_id": "j", "attempt": 0, "attempt_id": "a", "node": "n", "zone": "z",
                           "at": NOW.isoformat()}, "attempt"),
    (messages.AttemptEvent, {"kind": "ended", "job_id": "j", "attempt": 1, "attempt_id": "a", "node": "n",
                             "outcome": "exploded", "at": NOW.isoformat()}, "outcome"),
    (messages.Tick, {"seq": "many"}, "seq"),
    (messages.CancelRequest, {}, "job_id"),
    (messages.GcsObjectEvent, {"name": "x"}, "bucket"),
]


@pytest.mark.parametrize("model,data,field", BAD_MESSAGES, ids=lambda x: getattr(x, "__name__", None) or "")
def test_invalid_message_names_field(model, data, field):
    got_field, _ = field_and_reason(model, data)
    assert got_field == field
