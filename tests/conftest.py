"""Shared fixtures: the local cloud stack, started once per session.

Integration tests use `stack` (session-wide processes) and `clean_stack`
(per test: Firestore cleared through the emulator's endpoint, Pub/Sub reset
and the declared topics and subscriptions created again, so no message from
an earlier test can reach a later one).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

# CI runs the property tests with a fixed seed, so a submission's verdict does not depend on luck;
# local runs keep exploring new examples.
hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

from tpuq.runtime.clients import Clients

from tpuq.runtime.settings import Settings
from tpuq_dev.devstack import stack as devstack


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    state_dir = Path(tmp_path_factory.mktemp("tpuq-dev"))
    with devstack.DevStack(state_dir=state_dir, services=devstack.ALL_SERVICES_AVAILABLE()).running() as s:
        yield s


@pytest.fixture
def clean_stack(stack):
    stack.reset()
    return stack


@pytest.fixture
def clients(clean_stack) -> Clients:
    return Clients(Settings.from_env(clean_stack.env))


# The longest groups, started first on two workers so that none is left running alone at the end: the chaos soak
# (3 to 10 minutes), then the wheel's installs, then the other end-to-end modules (docs/DEVELOPING.md, Tests).
LONGEST_FIRST = ("/tests/e2e/test_chaos.py", "/tests/packaging/", "/tests/e2e/")


def _longest_first(item) -> int:
    path = str(item.fspath)
    return next((rank for rank, part in enumerate(LONGEST_FIRST) if part in path), len(LONGEST_FIRST))


# First, so that the groups are marked before pytest-xdist's worker reads them: its own hook (WorkerInteractor, registered
# after this conftest, so called before it) appends each item's `xdist_group` to its node id, and the `loadgroup`
# scheduler splits work by that suffix. Marked after it, no item had one and every test was a group of its own: a
# module's tests ran on both workers, each starting the module's stack, and the fuzz tally saw none of its module's sends.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """In one process (`make test PYTEST_WORKERS=0`) the end-to-end tests run last, and of them first the modules
    that never use the whole-system stack (fixture `system`): that stack, once up, stays up for the rest of the
    session, ticking every second (0.14 of a core when idle, measured 2026-12-05), so the modules with stacks of
    their own (the chaos soak, the run-life and fidelity tests, ...) run before it starts, not beside it. Under
    pytest-xdist (`make test`, as CI runs it: `--dist loadgroup --no-loadscope-reorder`) the longest
    groups go first (LONGEST_FIRST). The tests on the whole-system stack (fixture `system`) are one
    group, so one worker brings it up once and runs them all; every other module is a group of its own, so a
    module that starts a stack for its tests starts it once, on whichever worker is free."""
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts alike, the controller keeps the order
        items.sort(key=_longest_first)
    else:
        on_system = {str(item.fspath) for item in items if "system" in getattr(item, "fixturenames", ())}
        items.sort(key=lambda item: ("/tests/e2e/" in str(item.fspath), str(item.fspath) in on_system))
    for item in items:
        if "system" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("whole-system-stack"))
        else:
            item.add_marker(pytest.mark.xdist_group(str(item.fspath)))


@pytest.fixture(autouse=True)
def _fleet_choice_not_inherited(request, monkeypatch):
    """TPUQ_FLEET names the fleet that in-process services load (tpuq.runtime.fleetstore.load_fleet). The whole-system
    stack of tests/e2e (session-scoped) exports its own, `demo`, for the rest of the session; a test outside
    tests/e2e stores a fleet of its own and must not be served `demo`'s name. The stacks' services get
    TPUQ_FLEET from their stack's env, not from here. Nor the session stacks' ids (tpuq.operations.stackenv.ENV_STACK_ID,
    ENV_STACK_DIR): a test that points the CLI at other emulators would be told its environment is stale."""
    if "e2e" not in request.node.path.parts:
        from tpuq.operations.stackenv import ENV_STACK_DIR, ENV_STACK_ID

        for key in ("TPUQ_FLEET", ENV_STACK_ID, ENV_STACK_DIR):
            monkeypatch.delenv(key, raising=False)
