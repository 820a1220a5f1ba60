"""cloudbuild.yaml builds and deploys every service in infra/, and each image starts what the local stack starts."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shlex
from pathlib import Path

import yaml

from tpuq import topology
from tpuq.deploy.infra import INFRA_DIR
from tpuq.devstack.stack import service_argv
from tpuq.entrypoints import source_file

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


def test_infra_declares_exactly_the_topology_services():
    assert sorted(INFRA_SERVICES) == sorted(topology.SERVICES)


def test_every_file_a_step_names_exists():
    for step in BUILD["steps"]:
        args = step.get("args", [])
        if "-f" in args:
            dockerfile = REPO / args[args.index("-f") + 1]
            assert dockerfile.exists(), f"{step['id']}: {dockerfile}"
            assert args[-1] == ".", f"{step['id']} builds from the repository root, so that shared/ is in the context"
            for keyword, rest in dockerfile_instructions(dockerfile):
                if keyword == "COPY":
                    for source in shlex.split(rest)[:-1]:
                        assert (REPO / source).exists(), f"{dockerfile}: COPY {source}"
        for arg in args:
            for word in shlex.split(arg) if " " in arg else [arg]:
                if re.fullmatch(r"(services|shared|infra)/[\w./-]+", word):
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
    for name in INFRA_SERVICES:
        instructions = dockerfile_instructions(REPO / "services" / name / "Dockerfile")
        cmd = json.loads([rest for keyword, rest in instructions if keyword == "CMD"][-1])
        workdir = [rest for keyword, rest in instructions if keyword == "WORKDIR"][-1]
        assert workdir == "/app"
        # The same argv as DevStack's, with the container's interpreter and Cloud Run's port: both start the
        # installed module tpuq.entrypoints.<name>, never a file of the source tree.
        assert cmd == service_argv(name, "0.0.0.0", 8080, python="python")
        assert not any(arg.startswith(("services/", "shared/", "./", "/app")) for arg in cmd), cmd


def test_each_services_main_py_is_the_installed_entry_module():
    """services/<name>/main.py stays where reviewers look, and serves exactly what the containers start."""
    for name in INFRA_SERVICES:
        entry = importlib.import_module(f"tpuq.entrypoints.{name}")
        spec = importlib.util.spec_from_file_location(f"main_{name}", REPO / "services" / name / "main.py")
        main = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(main)
        assert main.handle is entry.handle and main.SERVICE is entry.SERVICE
        assert Path(entry.__file__).resolve() == source_file(name).resolve()
