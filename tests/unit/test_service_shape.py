"""One service runtime, one handler shape (issue 33 §5): every service's handlers module has module-level
`on_<topic>` handlers in a route table `ROUTES` that covers exactly its push subscriptions, and a
`build_service(settings, clients)` that builds it with everything passed in."""

from __future__ import annotations

import importlib
import inspect

import pytest

from tpuq.contracts import topology
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings


@pytest.mark.parametrize("service", topology.SERVICES)
def test_each_service_routes_every_subscription_of_its_own_to_a_module_level_on_handler(service):
    handlers = importlib.import_module(f"tpuq.{service}.handlers")
    assert set(handlers.ROUTES) == {s.path for s in topology.subscriptions_for(service)}
    for path, handler in handlers.ROUTES.items():
        assert handler.__name__.startswith("on_"), (path, handler)
        assert handler.__qualname__ == handler.__name__, f"{path}: {handler.__qualname__} is not module-level"
        assert list(inspect.signature(handler).parameters)[-1] == "ctx"


@pytest.mark.parametrize("service", topology.SERVICES)
def test_build_service_takes_the_settings_and_clients_it_is_given(service):
    handlers = importlib.import_module(f"tpuq.{service}.handlers")
    settings = Settings(project="p", fleet="f")
    clients = Clients(settings)
    built = handlers.build_service(settings, clients)
    assert (built.name, built.settings, built.clients) == (service, settings, clients)
    assert dict(built.routes) == dict(handlers.ROUTES)
    # Two services built on the same clients keep their own per-instance state (no registry keyed by clients).
    again = handlers.build_service(settings, clients)
    assert built.state is None or built.state is not again.state


def test_clients_use_what_they_are_given_and_refuse_what_they_do_not_know():
    store = object()
    clients = Clients(Settings(project="p"), firestore=store)
    assert clients.firestore is store
    with pytest.raises(TypeError, match="no client called firestre"):
        Clients(Settings(project="p"), firestre=store)
