"""The claimer: races queued resources across zones for capacity requests and watches what it owns.

- classify: error text -> failure class (pure, table-tested)
- model:    state, events and effects (plain data)
- decide:   the pure core, (state, event, now, rng) -> effects
- statestore, tpuapi, sshkeys: the adapters; handlers: the service shell
- (`tpuq fleet` reads its documents through `tpuq.contracts.documents`, in `tpuq.operations.fleetreport`)
"""
