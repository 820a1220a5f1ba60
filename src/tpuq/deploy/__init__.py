"""`tpuq deploy`: infra/ (reviewable files) -> a pure plan against the project's state -> apply through adapters.

- tpuq.deploy.infra     loads and checks infra/ (pubsub.yaml is generated from tpuq.topology)
- tpuq.deploy.plan      plan(target, infra, state) -> list[Action], pure
- tpuq.deploy.gcp       REST adapters, reading the project's state, and apply(actions, adapters)
"""
