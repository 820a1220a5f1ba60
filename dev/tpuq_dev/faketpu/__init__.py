"""A faithful local Cloud TPU: the fake TPU API server over the capacity model, with real SSH worker hosts.

See README.md in this directory. Modules:
- server: FakeTpuServer(scenario, time_scale, state_dir).start() -> url, .stop()
- control: FakeTpuControl(url), the client of the /_fake/ control endpoints
- hosts: real sshd worker hosts (WorkerHostManager, parse_ssh_keys_metadata)
- api: the Flask routes and JSON rendering
- measure: the fake's own benchmark
The state machine, its error catalogue, create validation, scenario and clock are tpuq_dev.capacitymodel.
Run standalone: python -m tpuq_dev.faketpu --help
"""
