"""An unknown field is told the known one it most likely misspells, wherever in the document it is, first and once
(`tpuq.contracts.fieldnames`, through `describe_validation_error`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tpuq.contracts.errors import describe_validation_error
from tpuq.contracts.fieldnames import did_you_mean, known_fields
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts.jobspec import JobFile, JobSpec


def _reason(model, data) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return describe_validation_error(caught.value, model=model)


@pytest.mark.parametrize("model,data,field,meant", [
    (JobFile, {"jobs": [{"tpu": "v4-8", "command": "x", "priorty": "high"}]}, "jobs[0].priorty", "priority"),
    (JobFile, {"command": "x", "tpu": "v4-8", "max_preemption": 2}, "jobs[0].max_preemption", "max_preemptions"),
    (JobFile, {"jobs": [{"tpu": "v4-8", "command": "x", "caches": [{"key": "pip", "pth": "p"}]}]},
     "jobs[0].caches[0].pth", "path"),
    (FleetFile, {"name": "f", "project": "p", "tpus": [{"id": "a", "type": "v4-8", "zones": ["us-central2-b"],
                                                      "cout": 2}]}, "tpus[0].cout", "count"),
    (FleetFile, {"name": "f", "project": "p", "tpus": [], "idle_timout_seconds": 60}, "idle_timout_seconds",
     "idle_timeout_seconds"),
])
def test_a_misspelt_field_is_told_the_one_it_likely_meant(model, data, field, meant):
    assert f"{field}: unknown field; did you mean `{meant}`?" in _reason(model, data)[1]


def test_a_name_like_none_of_them_gets_no_guess():
    _, reason = _reason(JobFile, {"jobs": [{"tpu": "v4-8", "command": "x", "colour": "red"}]})
    assert reason == "jobs[0].colour: unknown field"


def test_the_known_names_follow_lists_dicts_and_optional_values():
    assert "command" in known_fields(JobFile, ("jobs", 0)) and "priority" in known_fields(JobSpec, ())
    assert "path" in known_fields(JobSpec, ("caches", 3))
    assert known_fields(JobSpec, ("no_such_field",)) == [] and known_fields(JobSpec, ("command",)) == []
    assert did_you_mean("comand", ["command", "jobs"]) == "command" and did_you_mean("x", ["command"]) is None


def test_a_misspelt_required_field_is_said_once_and_first():
    field, reason = _reason(JobFile, {"jobs": [{"tpu": 8, "comand": "x"}]})
    assert field == "jobs[0].comand"
    assert reason.startswith("jobs[0].comand: unknown field; did you mean `command`?; jobs[0].tpu: ")
    assert "command: is required" not in reason
