"""Ownership: nothing but the fleet's own resources can be deleted, by construction and by property."""

from __future__ import annotations

import ast
from datetime import datetime, timedelta, timezone
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tpuq.janitor
from tpuq.janitor import decide as d
from tpuq.janitor.deleter import DeleteAdapter, NotOurs
from tpuq.runtime.ownership import LABEL_FLEET, LABEL_OWNER, LABEL_REQUEST, is_ours
from tests.janitor.factories import fleet, node, ours, qr

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def test_adapter_refuses_foreign_resources_without_calling_the_api():
    f = fleet()
    client = mock.Mock()
    adapter = DeleteAdapter(client, f)
    foreign = [qr("tpuq-x", "SUSPENDED"),  # our prefix, no label
               qr("other-x", "SUSPENDED", labels=ours(f)),  # our label, another prefix
               qr("tpuq-x", "SUSPENDED", labels={**ours(f), LABEL_FLEET: "f2"}),  # another fleet of ours
               node("someone", "PREEMPTED"), node("tpuq-y", "PREEMPTED", labels={LABEL_OWNER: "other"})]
    for resource in foreign:
        with pytest.raises(NotOurs):
            adapter.delete(resource, force=True, reason="test")
    assert client.method_calls == []


def test_adapter_deletes_ours_by_kind():
    f = fleet()
    client = mock.Mock()
    adapter = DeleteAdapter(client, f)
    adapter.delete(qr("tpuq-r1-a", "SUSPENDED", labels=ours(f)), force=True, reason="test")
    adapter.delete(node("tpuq-r1-b", "PREEMPTED", labels=ours(f)), force=True, reason="test")
    assert [c[0] for c in client.method_calls] == ["delete_queued_resource", "delete_node"]
    assert client.delete_queued_resource.call_args.kwargs["request"].force is True


def test_no_janitor_module_but_the_adapter_can_reach_a_delete_call():
    """The adapter is the only place a delete_* method of the TPU client is named."""
    package = Path(tpuq.janitor.__file__).parent
    offenders = []
    for path in package.glob("*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Attribute) and n.attr in ("delete_queued_resource", "delete_node") \
                    and path.name != "deleter.py":
                offenders.append(f"{path.name}:{n.lineno}")
            if isinstance(n, ast.Attribute) and n.attr == "tpu" and path.name == "handlers.py":
                pass  # the client is handed to the adapter in one place (default_adapter)
    assert offenders == []


# ------------------------------------------------------------------ property: random fleets and resources

prefixes = st.sampled_from(["tpuq", "tpu", "tpuq-a", "other", "tpuqx"])
fleet_names = st.sampled_from(["f1", "f2", "prod"])
states_qr = st.sampled_from(["ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE", "FAILED",
                             "SUSPENDED", "DELETING", "CREATING", "SUSPENDING"])
states_node = st.sampled_from(["READY", "PREEMPTED", "TERMINATED", "CREATING", "DELETING"])


@st.composite
def label_sets(draw):
    labels = {}
    if draw(st.booleans()):
        labels[LABEL_OWNER] = draw(prefixes)
    if draw(st.booleans()):
        labels[LABEL_FLEET] = draw(fleet_names)
    if draw(st.booleans()):
        labels[LABEL_REQUEST] = draw(st.sampled_from(["r1", "r2"]))
    if draw(st.booleans()):
        labels["owner"] = draw(prefixes)  # someone else's scheme
    return labels


@st.composite
def resources(draw):
    rid = f"{draw(prefixes)}-{draw(st.sampled_from(['r1', 'r2']))}-{draw(st.integers(0, 5))}"
    zone = draw(st.sampled_from(["us-central2-b", "us-east1-d"]))
    if draw(st.booleans()):
        return qr(rid, draw(states_qr), zone=zone, labels=draw(label_sets()))
    return node(rid, draw(states_node), zone=zone, labels=draw(label_sets()))


@st.composite
def fleets(draw):
    return fleet(draw(fleet_names), draw(prefixes), idle=draw(st.integers(0, 5)), keep_warm=draw(st.integers(0, 2)),
                 grace=draw(st.sampled_from([0, 30])))


def _foreign_names(resources_, f):
    return {r.name for r in resources_ if not is_ours(r, f)}


@settings(max_examples=300, deadline=None)
@given(f=fleets(), listed=st.lists(resources(), max_size=12, unique_by=lambda r: r.name),
       count=st.integers(0, 3),
       pending=st.booleans(), known=st.sets(st.sampled_from(["tpuq-r1-0", "tpu-r2-1", "other-r1-2"])))
def test_decide_functions_never_select_a_foreign_resource(f, listed, count, pending, known):
    foreign = _foreign_names(listed, f)
    chosen = list(d.decide_dead(listed, f, {r.name for r in listed}))
    chosen += d.decide_orphans(listed, known, {r.name: NOW - timedelta(hours=1) for r in listed}, f, NOW).deletes
    qrs = [r for r in listed if d.is_queued_resource(r)]
    race = [d.RaceMember(r.name, r, "idle") for r in qrs]
    losers = d.decide_losers(race, f, count, pending, {r.name for r in qrs})
    chosen += losers.deletes
    assert not {x.name for x in chosen} & foreign
    assert not {m.name for m in losers.surplus} & foreign
    for x in chosen:
        assert is_ours(x.resource, f) and d.state_of(x.resource) not in ("PROVISIONING", "DELETING")


@settings(max_examples=200, deadline=None)
@given(f=fleets(), resource=resources())
def test_ours_needs_both_marks(f, resource):
    from tpuq.runtime.ownership import name_and_labels
    name, labels = name_and_labels(resource)
    both = d.short_node_name(name).startswith(f.owner_prefix + "-") and labels.get(LABEL_OWNER) == f.owner_prefix
    assert is_ours(resource, f) == (both and labels.get(LABEL_FLEET, f.name) == f.name)
