"""A faithful local Cloud TPU: fake TPU API server, capacity model, real SSH worker hosts.

See README.md in this directory. Modules:
- server: FakeTpuServer(scenario, time_scale, state_dir).start() -> url, .stop()
- control: FakeTpuControl(url), the client of the /_fake/ control endpoints
- hosts: real sshd worker hosts (WorkerHostManager, parse_ssh_keys_metadata)
- model: the state machine (FakeTpuWorld), clock-driven and HTTP-free
- errors: the RPC error catalogue (ApiError, RpcStatus, failure texts by class)
- validation: what a CreateQueuedResource body may hold
- scenario: the scenario file (load_scenario, Scenario)
- clock: ScaledClock, ManualClock
- api: the Flask routes and JSON rendering
Run standalone: python -m tpuq.faketpu --help
"""
