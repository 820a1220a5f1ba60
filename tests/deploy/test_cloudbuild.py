"""cloudbuild.yaml builds and deploys every service in infra/, and each image starts what the local stack starts."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pathspec
import requests
import yaml

from tpuq.contracts import topology
from tpuq.deploy.infra import DEPLOY_SERVICE_ACCOUNT, INFRA_DIR
from tpuq_dev.devstack import processes
from tpuq_dev.devstack.stack import service_argv
from tpuq.runtime.entrypoints import source_file

from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
BUILD = yaml.safe_load((REPO / "cloudbuild.yaml").read_text())
INFRA_SERVICES = [s["name"] for s in yaml.safe_load((INFRA_DIR / "services.yaml").read_text())["services"]]


def steps_by_id() -> dict[str, dict]:
    return {step["id"]: step for step in BUILD["steps"]}


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_infra_declares_exactly_the_topology_services_and_the_dashboard():
    # The dashboard (ui, tpuq.ui) is the one service no push reaches: tests/ui/test_ui_deploy.py checks its image.
    assert sorted(INFRA_SERVICES) == sorted([*topology.SERVICES, "ui"])


def test_every_file_a_step_names_exists():
    for step in BUILD["steps"]:
        args = step.get("args", [])
        if "-f" in args:
            dockerfile = REPO / args[args.index("-f") + 1]
            assert dockerfile.exists(), f"{step['id']}: {dockerfile}"
            assert args[-1] == ".", f"{step['id']} builds from the repository root, so that src/ is in the context"
            for keyword, rest in dockerfile_instructions(dockerfile):
                if keyword == "COPY":
                    for source in shlex.split(rest)[:-1]:
                        assert (REPO / source).exists(), f"{dockerfile}: COPY {source}"
        for arg in args:
            for word in shlex.split(arg) if " " in arg else [arg]:
                if re.fullmatch(r"(services|src|infra)/[\w./-]+", word):
                    assert (REPO / word).exists(), f"{step['id']}: {word}"


def test_every_service_is_built_pushed_and_deployed():
    steps = steps_by_id()
    for name in INFRA_SERVICES:
        build = steps[f"build-{name}"]
        assert build["args"][:3] == ["build", "-f", f"services/{name}/Dockerfile"]
        image = build["args"][build["args"].index("-t") + 1]
        assert steps[f"push-{name}"]["args"] == ["push", image]
        assert f"push-{name}" in steps["deploy"]["waitFor"]
        # the image the build tags is the one tpuq deploy runs (infra/services.yaml: image)
        assert image == "${_REGION}-docker.pkg.dev/$PROJECT_ID/tpuq/" + name + ":$BUILD_ID"
    assert "tpuq deploy ${_FLEET}" in steps["deploy"]["args"][-1]
    assert "--image-tag $BUILD_ID" in steps["deploy"]["args"][-1]
    assert "--skip-services" in steps["infra"]["args"][-1]
    services_infra = yaml.safe_load((INFRA_DIR / "services.yaml").read_text())
    assert services_infra["image"] == "${region}-docker.pkg.dev/${project}/tpuq/${service}:${image_tag}"


def test_each_dockerfile_cmd_starts_the_entry_point_the_local_stack_runs():
    for name in topology.SERVICES:
        instructions = dockerfile_instructions(REPO / "services" / name / "Dockerfile")
        cmd = json.loads([rest for keyword, rest in instructions if keyword == "CMD"][-1])
        workdir = [rest for keyword, rest in instructions if keyword == "WORKDIR"][-1]
        assert workdir == "/app"
        # The same argv as DevStack's, with the container's interpreter; both start the installed module
        # tpuq.runtime.entrypoints.<name>, never a file of the source tree. No --port: the server listens on $PORT, as
        # Cloud Run requires.
        argv = service_argv(name, "0.0.0.0", 8080, python="python")
        assert argv[-2:] == ["--port", "8080"] and cmd == argv[:-2]
        assert not any("8080" in word for word in cmd)
        assert not any(arg.startswith(("services/", "shared/", "./", "/app")) for arg in cmd), cmd


def test_a_service_image_listens_on_the_port_cloud_run_gives_it(tmp_path):
    """The scheduler image's CMD, run from a copy of what the image holds at /app, with Cloud Run's $PORT."""
    instructions = dockerfile_instructions(REPO / "services" / "scheduler" / "Dockerfile")
    cmd = json.loads([rest for keyword, rest in instructions if keyword == "CMD"][-1])
    port = processes.free_port()
    env = {**os.environ, "PORT": str(port), "TPUQ_SERVICE": "scheduler"}
    cmd = [sys.executable if word == "python" else word for word in cmd]
    cmd[cmd.index("--host") + 1] = "127.0.0.1"  # the same server; only loopback on a shared machine
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        answer = wait_until(lambda: requests.get(f"http://127.0.0.1:{port}/", timeout=1), timeout=60,
                            what=f"the scheduler on $PORT={port}")
        assert answer.status_code == 200 and answer.text == "scheduler ok"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_build_runs_as_the_deploy_account_and_logs_where_a_chosen_account_may():
    account = BUILD["serviceAccount"]
    assert account == f"projects/$PROJECT_ID/serviceAccounts/{DEPLOY_SERVICE_ACCOUNT}@$PROJECT_ID.iam.gserviceaccount.com"
    assert DEPLOY_SERVICE_ACCOUNT in {sa["id"] for sa in yaml.safe_load((INFRA_DIR / "iam.yaml").read_text())["service_accounts"]}
    # A build with its own account must say where its logs go, or Cloud Build refuses it.
    assert BUILD["options"]["logging"] in ("CLOUD_LOGGING_ONLY", "GCS_ONLY", "NONE")


def test_gcloud_builds_submit_uploads_the_sources_and_not_the_virtualenv_or_git():
    ignore = pathspec.PathSpec.from_lines("gitignore", (REPO / ".gcloudignore").read_text().splitlines())
    for left_out in (".venv/bin/python", ".git/HEAD", "shared/__pycache__/cli.cpython-311.pyc",
                     ".pytest_cache/v/x", "build/lib/tpuq/cli.py", "tpuq.egg-info/PKG-INFO", "services/claimer/__pycache__/main.cpython-311.pyc"):
        assert ignore.match_file(left_out), left_out
    needed = ["pyproject.toml", "cloudbuild.yaml", "fleet.yaml", "my-fleet.yaml"]
    for step in BUILD["steps"]:
        args = step.get("args", [])
        if "-f" in args:
            dockerfile = REPO / args[args.index("-f") + 1]
            needed.append(str(dockerfile.relative_to(REPO)))
            for keyword, rest in dockerfile_instructions(dockerfile):
                if keyword == "COPY":
                    needed += [str(p.relative_to(REPO)) for source in shlex.split(rest)[:-1]
                               for p in ([REPO / source] if (REPO / source).is_file() else (REPO / source).rglob("*.py"))]
    needed += [str(p.relative_to(REPO)) for p in (REPO / "infra").iterdir()]
    assert [path for path in needed if ignore.match_file(path)] == []


def test_no_service_answers_on_a_path_cloud_run_reserves():
    """Google's front end keeps paths ending in z (/healthz, ...) for itself: they never reach the container."""
    assert [s.path for s in topology.SUBSCRIPTIONS if s.path.rstrip("/").endswith("z")] == []
    quoted_path = re.compile(r"""["'](/[\w/.-]*z)["']""")
    found = [(str(path.relative_to(REPO)), m.group(1)) for root in ("shared", "services", "operations", "cli", "deploy", "dev") for path in (REPO / root).rglob("*.py")
             for m in quoted_path.finditer(path.read_text())]
    assert found == []
def test_each_services_main_py_is_the_installed_entry_module():
    """services/<name>/main.py is the module the containers and the local stack serve (tpuq.<name>.main)."""
    for name in topology.SERVICES:
        entry = importlib.import_module(f"tpuq.{name}.main")
        assert Path(entry.__file__).resolve() == source_file(name).resolve() == REPO / "services" / name / "main.py"
        assert callable(entry.handle)


def test_the_local_stack_finds_every_services_entry_module():
    """The stack starts the services whose entry module this install has: here, all four (a wrong module name
    would start none, and every stack test would wait for services that never came)."""
    from tpuq_dev.devstack.stack import ALL_SERVICES_AVAILABLE

    assert ALL_SERVICES_AVAILABLE() == topology.SERVICES
