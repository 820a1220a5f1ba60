"""`tpuq deploy`: infra/ (reviewable files) -> a pure plan against the project's state -> apply through adapters.

- tpuq.deploy.infra     loads and checks infra/ (pubsub.yaml is generated from tpuq.contracts.topology)
- tpuq.deploy.model     Target, ProjectState, Action: the plain data every planner shares
- tpuq.deploy.plan      plan(target, infra, state) -> list[Action], pure (with network, job_buckets, generated_secrets)
- tpuq.deploy.gcp       REST adapters, reading the project's state, and apply(actions, adapters)
"""
