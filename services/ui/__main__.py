"""`python -m tpuq.ui [--host H]`: the tpuq-ui Cloud Run service (its Dockerfile's CMD), on $PORT (8080 when unset)
of every interface unless --host says otherwise."""

import argparse
import os

from tpuq.runtime import logs
from tpuq.ui.serve import ENV_PORT, deployed_app, serve

parser = argparse.ArgumentParser(prog="python -m tpuq.ui")
parser.add_argument("--host", default="0.0.0.0")
args = parser.parse_args()
env = dict(os.environ)  # read once, here, and passed in
logs.setup(env=env)
serve(deployed_app(env), args.host, int(env.get(ENV_PORT) or 8080),
      on_ready=lambda url: print(f"tpuq ui listening on {url}", flush=True))
