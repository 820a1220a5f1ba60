"""The store contract: the same tests run against the in-memory Firestore and the Firestore emulator.

`db` is parametrized: `memory` needs nothing; `emulator` uses the session
stack's Firestore emulator (started on first use). Each test writes only
below a collection of its own (`col`), so no service of the stack ever reads
what it writes and no reset is needed between tests.
"""

from __future__ import annotations

import uuid

import pytest

from tpuq.runtime.clients import Clients

from tpuq.runtime.settings import Settings
from tpuq_dev.inmemory import MemoryFirestore


@pytest.fixture(scope="session")
def emulator_firestore(stack):
    return Clients(Settings.from_env(stack.env)).firestore


@pytest.fixture(params=["memory", "emulator"])
def db(request):
    if request.param == "memory":
        return MemoryFirestore()
    return request.getfixturevalue("emulator_firestore")


@pytest.fixture
def col(db):
    """A collection no other test (and no service) uses."""
    return db.collection(f"contract-{uuid.uuid4().hex[:12]}")
