"""The web dashboard (`tpuq ui`, and the tpuq-ui Cloud Run service): jobs, one job's attempts, workers and logs,
the fleet, dead letters and cost, over the read paths the CLI uses. `tpuq.ui.app.create_app` builds it;
`tpuq.cli.ui` serves it locally, `python -m tpuq.ui` on Cloud Run. Nothing is created at import time."""
