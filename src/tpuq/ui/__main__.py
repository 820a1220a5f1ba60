"""`python -m tpuq.ui`: the tpuq-ui Cloud Run service (its Dockerfile's CMD), on $PORT of every interface."""

import os

from tpuq.entrypoints import configure_logging
from tpuq.ui.serve import ENV_PORT, deployed_app, serve

configure_logging()
serve(deployed_app(), "0.0.0.0", int(os.environ.get(ENV_PORT) or 8080),
      on_ready=lambda url: print(f"tpuq ui listening on {url}", flush=True))
