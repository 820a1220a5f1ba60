"""Tried as a new user would: every command has --help, and mistakes give one line and a non-zero exit."""

from __future__ import annotations

import subprocess

import pytest

COMMANDS = ["init", "validate", "submit", "status", "list", "watch", "logs", "cancel", "set-priority",
            "validate-fleet", "validate-jobs", "fleet", "fleet apply", "demo",
            "dev", "dev up", "dev down", "dev env", "dev status", "simulate"]


def run(args, tmp_path, **env):
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.endswith("_EMULATOR_HOST")}
    full_env.update({"TPUQ_DEV_DIR": str(tmp_path / "nostack"), "GOOGLE_APPLICATION_CREDENTIALS": "", **env})
    return subprocess.run(["tpuq", *args], capture_output=True, text=True, env=full_env, timeout=60)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, tmp_path):
    r = run([*command.split(), "--help"], tmp_path)
    assert r.returncode == 0 and "Usage" in r.stdout


def test_help_keeps_bracketed_words_that_rich_would_read_as_markup(tmp_path):
    r = run(["submit", "--help"], tmp_path, COLUMNS="200")
    assert "(every worker, prefixed [wN]) until they end" in r.stdout, r.stdout


def assert_one_line_error(r, *words):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr + r.stdout
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_bad_files(tmp_path):
    (tmp_path / "bad.yaml").write_text("jobs: [\n")
    assert_one_line_error(run(["validate", str(tmp_path / "bad.yaml")], tmp_path), "not valid YAML", "line")
    (tmp_path / "job.yaml").write_text("jobs:\n  - tpu: v4-8\n    priority: urgent\n    command: x\n")
    assert_one_line_error(run(["validate", str(tmp_path / "job.yaml")], tmp_path), "jobs[0].priority")
    assert_one_line_error(run(["submit", str(tmp_path / "job.yaml")], tmp_path), "jobs[0].priority")
    (tmp_path / "typo.yaml").write_text("jobs:\n  - tpu: v4-8\n    comand: x\n")
    for command in ("validate", "submit"):
        assert_one_line_error(run([command, str(tmp_path / "typo.yaml")], tmp_path),
                              "jobs[0].comand: unknown field; did you mean `command`?")
    (tmp_path / "twice.yaml").write_text("jobs:\n  - tpu: v4-8\n    command: a\n    command: b\n")
    for command in ("validate", "submit"):
        assert_one_line_error(run([command, str(tmp_path / "twice.yaml")], tmp_path), "line 4", "'command' twice")
    # A local bundle folder that is not there: validate says so, as submit would (relative to the file).
    (tmp_path / "nobundle.yaml").write_text("jobs:\n  - tpu: v4-8\n    command: x\n  - tpu: v4-8\n"
                                            "    bundle: ./nonexistent\n    command: x\n")
    assert_one_line_error(run(["validate", str(tmp_path / "nobundle.yaml")], tmp_path),
                          f"jobs[1].bundle: ./nonexistent is not a directory ({tmp_path.resolve()}/nonexistent)")
    (tmp_path / "nonexistent").mkdir()
    assert run(["validate", str(tmp_path / "nobundle.yaml")], tmp_path).returncode == 0
    (tmp_path / "empty.yaml").write_text("")
    assert_one_line_error(run(["validate", str(tmp_path / "empty.yaml")], tmp_path), "the file is empty")
    (tmp_path / "one.yaml").write_text("comand: x\ntpu: v4-8\n")  # one job's form, its `command:` misspelt
    assert_one_line_error(run(["validate", str(tmp_path / "one.yaml")], tmp_path), "`comand:` looks like `command:`")
    assert_one_line_error(run(["validate", str(tmp_path / "missing.yaml")], tmp_path), "no such file")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    assert_one_line_error(run(["validate", str(tmp_path / "bin.yaml")], tmp_path))
    (tmp_path / "fleet.yaml").write_text("name: f\nproject: p\ntpus:\n  - {id: a, type: v4-33, zone: us-central2-b}\n")
    assert_one_line_error(run(["validate", str(tmp_path / "fleet.yaml")], tmp_path), "tpus[0].type")


def test_stack_not_running(tmp_path):
    for args in (["status", "some-job"], ["list"], ["cancel", "x"], ["logs", "x"], ["fleet"], ["dev", "env"]):
        r = run(args, tmp_path, PUBSUB_EMULATOR_HOST="127.0.0.1:9", FIRESTORE_EMULATOR_HOST="127.0.0.1:9")
        assert_one_line_error(r, "not running")


def test_no_or_expired_credentials(tmp_path):
    creds = tmp_path / "creds.json"
    creds.write_text('{"type": "authorized_user", "client_id": "x", "client_secret": "y", "refresh_token": "z"}')
    r = run(["list"], tmp_path, GOOGLE_APPLICATION_CREDENTIALS=str(creds), GOOGLE_CLOUD_PROJECT="p")
    assert_one_line_error(r, "credentials")


@pytest.mark.parametrize("args, exit_code, expected", [
    ([], 0, ["Usage: tpuq", "submit"]),  # alone: the help, on stdout
    (["--version"], 0, ["tpuq 0.1.0"]),
    (["sumbit"], 2, ["Usage: tpuq", "No such command 'sumbit'. Did you mean 'submit'?"]),
    (["submit"], 2, ["Usage: tpuq submit", "Missing argument 'job_file'"]),
    (["status", "--bogus"], 2, ["Usage: tpuq status", "No such option: --bogus"]),
])
def test_usage_mistakes_print_the_usage_and_no_class_name(args, exit_code, expected, tmp_path):
    r = run(args, tmp_path)
    assert r.returncode == exit_code, r.stdout + r.stderr
    shown = r.stdout + r.stderr
    for text in expected:
        assert text in shown, shown
    for internal in ("Error:" if exit_code == 0 else "NoArgsIsHelpError", "UsageError", "NoSuchOption", "MissingParameter",
                     "Traceback"):
        assert internal not in shown, shown
