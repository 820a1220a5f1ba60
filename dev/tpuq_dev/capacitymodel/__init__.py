"""The capacity model: what Cloud TPU does with queued resources, nodes and quota, with no HTTP and no hosts.

- model: the state machine (FakeTpuWorld), clock-driven
- errors: the RPC error catalogue (ApiError, RpcStatus, failure texts by class)
- validation: what a CreateQueuedResource body may hold
- scenario: the scenario file (load_scenario, Scenario); scenarios/ holds the default one
- clock: ScaledClock, ManualClock

Two users: the fake Cloud TPU API of the local stack (tpuq_dev.faketpu, the dev extra) and the fleet
simulator. The services never import it.
"""
