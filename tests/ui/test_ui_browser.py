"""The dashboard in a real browser (headless Chromium from Debian, driven by Playwright) against a whole local
stack of this module's own (the demo's fleet and fake TPU: v4 in us-central2-a/b/c, zone b stocked out), served by
`tpuq ui --port 0` as a person starts it.

What a person sees, checked in the DOM (never pixels), with the page never reloaded where it must update live:
a job published on the jobs topic appears on the Jobs page; on its page the workers go from running to succeeded
and its log lines stream in; a `<script>` in its name and in a log line shows as text and never runs; a job pinned
to the stocked-out zone waits while the Fleet page shows that zone's back-off; cancelling it through the
confirmation cancels it (Firestore says so); a sweep is one row of the Jobs page, opening its group page (issue 36);
refused messages show on Dead letters; the Cost page draws its chart.

Screenshots go to the test's tmp folder; with TPUQ_UI_README_SHOTS=1 also to docs/images/ui-*.png (docs/USING.md's).
The running job waits at a gate the test opens (a file in /var/tmp, which the fake TPU's hosts share), so "while
it runs" never depends on how fast the machine is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tpuq.contracts import store
from tpuq.runtime.clients import Clients
from tpuq.runtime.settings import Settings

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DEADLINE = 300  # seconds, for what the stack does (a TPU to become ACTIVE on a loaded machine)
DOM_WAIT_MS = DEADLINE * 1000
GATES = Path("/var/tmp")  # the machine's own on every fake host (each has its own /tmp, homes, /dev, /proc)
STOCKED_OUT = "us-central2-b"
README_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


def _browser_or_skip():
    """Playwright's sync API, or a skip that says why: Chromium is installed by `make install-system` as root;
    where this runs as another user and it is missing, it cannot be installed."""
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (Debian's chromium package)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("playwright (tpuq's dev extra)")
        sync_playwright = None
    if missing:
        reason = f"{' and '.join(missing)} missing: `make install` installs them"
        if os.geteuid() == 0:
            pytest.fail(reason + " (this runs as root, so it can)")
        pytest.skip(reason + "; Chromium needs root to install (apt-get install chromium)")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _browser_or_skip()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def ui_stack(tmp_path_factory, browser):
    from tpuq_dev.devstack.stack import DEMO_DIR, DevStack

    s = DevStack(state_dir=Path(tmp_path_factory.mktemp("tpuq-ui")),
                 services=("scheduler", "claimer", "executor", "janitor"),
                 scenario=DEMO_DIR / "scenario.yaml", fleet_file=DEMO_DIR / "fleet.yaml",
                 time_scale=60.0, tick_period=1.0, extra_buckets=("tpuq-demo-us-central2",),
                 service_env={"TPUQ_EXECUTOR_PROBE_SECONDS": "2"})
    with s.running():
        yield s


@pytest.fixture(scope="module")
def ui_url(ui_stack):
    """`tpuq ui --port 0` against the stack, as its `tpuq dev env` shell would run it; the URL it prints."""
    env = {**os.environ, **ui_stack.env, "TPUQ_OWNER": "ui-tester"}
    server = subprocess.Popen(["tpuq", "ui", "--port", "0"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(server.stdout.readline()), daemon=True)
    reader.start()
    try:
        wait_until(lambda: first or server.poll() is not None, timeout=120, what="tpuq ui to print its URL")
        assert first and first[0].startswith("tpuq ui: http://127.0.0.1:"), (first, server.stderr.read())
        assert "as ui-tester" in first[0]
        yield first[0].split()[2].rstrip("/")
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def clients(ui_stack) -> Clients:
    return Clients(Settings.from_env(ui_stack.env))


@pytest.fixture
def page(browser, ui_url, tmp_path):
    # bypass_csp: the page's Content-Security-Policy forbids the eval Playwright's waits use, and without it
    # "no script runs" below is proven by the escaping alone, not by the CSP behind it.
    context = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
    p = context.new_page()
    p.dialogs = []
    p.on("dialog", lambda d: (p.dialogs.append(d.message), d.dismiss()))  # an alert() would be a script that ran
    p.base = ui_url
    p.shots = tmp_path / "screenshots"
    p.shots.mkdir()
    yield p
    context.close()


def shoot(page, name: str, readme: bool = True) -> None:
    path = page.shots / f"ui-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if readme and os.environ.get("TPUQ_UI_README_SHOTS"):
        README_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, README_IMAGES / path.name)


def job_state(clients, job_id: str) -> str | None:
    snap = clients.firestore.collection(store.JOBS).document(job_id).get()
    return (snap.to_dict() or {}).get("state") if snap.exists else None


def test_a_published_job_appears_runs_live_and_streams_its_logs_as_text(page, clients):
    gate = GATES / f"tpuq-ui-gate-{uuid.uuid4().hex[:8]}"
    job_id = f"ui-{uuid.uuid4().hex[:6]}"
    page.goto(f"{page.base}/jobs")
    page.evaluate("window.__notReloaded = true")
    clients.publish("jobs", {
        "id": job_id, "name": "<script>window.__ranName = 1; alert('name')</script>sweep", "tpu": "v4-8",
        "command": ("echo 'hello <script>window.__ranLog = 1; alert(\"log\")</script>'; echo first-line; "
                    f"i=0; while [ ! -e {gate} ] && [ $i -lt 1800 ]; do i=$((i+1)); sleep 0.1; done; "
                    "echo last-line")}, owner="ui-tester")
    try:
        row = page.wait_for_selector(f'tr[data-job="{job_id}"]', timeout=DOM_WAIT_MS)  # no reload: polled in
        assert "<script>window.__ranName" in row.query_selector(".name").inner_text()
        shoot(page, "jobs-new", readme=False)
        assert page.evaluate("window.__notReloaded") is True

        page.click(f'tr[data-job="{job_id}"] a')
        page.wait_for_selector("#job-id")
        page.evaluate("window.__notReloaded = true")
        page.wait_for_selector('#workers tr[data-worker="0"][data-state="running"]', timeout=DOM_WAIT_MS)
        page.wait_for_function("document.getElementById('logs') && "
                               "document.getElementById('logs').innerText.includes('first-line')", timeout=DOM_WAIT_MS)
        logs = page.inner_text("#logs")
        assert "[w0] hello <script>window.__ranLog = 1; alert(\"log\")</script>" in logs
        assert "last-line" not in logs  # it waits at the gate: this is the log while the job runs
        shoot(page, "job-running")
        gate.touch()
        page.wait_for_selector('#workers tr[data-worker="0"][data-state="succeeded"]', timeout=DOM_WAIT_MS)
        page.wait_for_function("document.getElementById('logs').innerText.includes('last-line')", timeout=DOM_WAIT_MS)
        page.wait_for_selector('#job-live[data-state="succeeded"]', timeout=DOM_WAIT_MS)  # the job follows
        assert page.inner_text('#workers tr[data-worker="0"] .exit') == "0"
        assert page.query_selector_all("#attempts li[data-outcome='succeeded']")
        assert page.evaluate("window.__notReloaded") is True  # every change above came in without a reload
        assert "<script>" in page.inner_text("#job-name")
        assert page.evaluate("[window.__ranName, window.__ranLog]") == [None, None] and page.dialogs == []
        # Which attempt the logs are of (issue 35): one attempt, so no attempt picker, and its header.
        assert page.inner_text("#log-header").startswith(f"attempt 1 of 1 of job {job_id} (started ")
        assert page.query_selector("#log-attempts") is None
        shoot(page, "job")
        assert job_state(clients, job_id) == "succeeded"
        page.goto(f"{page.base}/jobs")  # the list's owner and attempts columns
        row = page.wait_for_selector(f'tr[data-job="{job_id}"]')
        assert (row.query_selector(".owner").inner_text(), row.query_selector(".attempts").inner_text()) == \
            ("ui-tester", "1")
    finally:
        gate.unlink(missing_ok=True)


def test_a_waiting_job_the_stocked_out_zones_backoff_priority_and_cancel_through_the_confirmation(page, clients):
    job_id = f"ui-wait-{uuid.uuid4().hex[:6]}"
    clients.publish("jobs", {"id": job_id, "tpu": "v4-8", "zone": STOCKED_OUT, "command": "echo never"})
    page.goto(f"{page.base}/fleet")
    page.evaluate("window.__notReloaded = true")
    backoff = f'tr[data-zone="{STOCKED_OUT}"][data-type="v4-8"] td.backoff'
    page.wait_for_function(f"(e => e && e.innerText.trim() !== '')(document.querySelector('{backoff}'))",
                           timeout=DOM_WAIT_MS)
    assert "backed off until" in page.inner_text(f'tr[data-zone="{STOCKED_OUT}"][data-type="v4-8"] td.note')
    assert page.evaluate("window.__notReloaded") is True
    shoot(page, "fleet")

    # The zone's back-off may be an earlier job's: wait for this job to be stored before opening its page.
    wait_until(lambda: job_state(clients, job_id), timeout=DEADLINE, what=f"{job_id} stored")
    page.goto(f"{page.base}/jobs/{job_id}")
    assert page.inner_text("#job-state") == "pending"
    page.select_option("#priority-choice", "high")
    page.click("#set-priority")
    page.wait_for_selector("#confirm-form")
    page.click("#confirm")
    assert "priority high (was normal)" in page.inner_text("#outcome")
    assert clients.firestore.collection(store.JOBS).document(job_id).get().to_dict()["priority"] == "high"
    page.click("#back")
    assert page.inner_text("#job-priority") == "high"
    page.click("#cancel")
    page.wait_for_selector("#confirm-form")
    assert job_state(clients, job_id) == "pending"  # the confirmation itself changes nothing
    shoot(page, "confirm-cancel")
    page.click("#confirm")
    assert "cancel requested" in page.inner_text("#outcome")
    wait_until(lambda: job_state(clients, job_id) == "cancelled", timeout=DEADLINE, what="the job cancelled")
    page.click("#back")
    assert page.inner_text("#job-state") == "cancelled"


def test_a_sweep_folds_into_one_jobs_row_whose_group_page_follows_its_tasks_live(page, clients):
    """Issue 36 §1: a 2-task sweep is one row of the Jobs page; its link opens the group page, whose progress,
    counts and task rows (with each task's sweep value) update without a reload until every task ended."""
    group = f"ui-sweep-{uuid.uuid4().hex[:6]}"
    clients.publish("jobs", {"id": group, "tpu": "v4-8", "sweep": {"LR": ["1e-3", "3e-4"]},
                             "command": "echo lr=$LR index=$TPUQ_ARRAY_INDEX"}, owner="ui-tester")
    page.goto(f"{page.base}/jobs")
    row = page.wait_for_selector(f'tr[data-group="{group}"]', timeout=DOM_WAIT_MS)  # one row, polled in
    assert "group of 2 tasks" in row.query_selector(".reason").inner_text()
    assert page.query_selector(f'tr[data-job="{group}-0"]') is None
    row.query_selector("a").click()
    page.wait_for_selector("#group-id")
    page.evaluate("window.__notReloaded = true")
    assert page.inner_text("#group-id") == group
    page.wait_for_selector('#group-live[data-ended="2"]', timeout=DOM_WAIT_MS)
    assert page.evaluate("window.__notReloaded") is True
    assert page.inner_text("#group-ended") == "2/2 ended"
    assert page.inner_text('#group-counts .count[data-state="succeeded"]').startswith("2 ")
    cells = [page.inner_text(f'#tasks tr[data-job="{group}-{i}"] td.sweep') for i in range(2)]
    assert cells == ["1e-3", "3e-4"]
    shoot(page, "group")
    page.click(f'#tasks tr[data-job="{group}-1"] a')  # a task's row opens its job page, which links back
    page.wait_for_selector("#job-id")
    assert page.inner_text("#job-id") == f"{group}-1" and page.inner_text("#job-group") == group


def test_dead_letters_and_cost(page, clients):
    message_id = clients.publish("jobs", {"tpu": "v9-8", "command": "echo never"})
    wait_until(lambda: any((d.to_dict() or {}).get("message_id") == message_id
                           for d in clients.firestore.collection(store.DEAD_LETTERS).stream()),
               timeout=DEADLINE, what="the refused message recorded")
    page.goto(f"{page.base}/dead-letters")
    row = page.wait_for_selector(f'tr[data-message="{message_id}"]')
    assert row.query_selector(".field").inner_text() == "tpu" and "v9-8" in row.query_selector(".reason").inner_text()
    shoot(page, "dead-letters")

    page.goto(f"{page.base}/cost")
    page.wait_for_function("window.tpuqCostChart !== undefined")  # Chart.js drew it
    if any(True for _ in clients.firestore.collection(store.TPUS).limit(1).stream()):  # the first test's TPU
        assert page.query_selector_all("#cost-rows tr[data-type='v4-8']")
    shoot(page, "cost")
    page.goto(f"{page.base}/jobs")  # by now: a job that succeeded, one cancelled, docs/USING.md's picture
    page.wait_for_selector("tr[data-state='cancelled']")
    shoot(page, "jobs")


def test_the_pages_run_under_their_content_security_policy(browser, ui_url):
    """Enforced (no bypass): htmx, Chart.js and our script load and run, and nothing trips the policy."""
    context = browser.new_context()
    try:
        p = context.new_page()
        complaints: list[str] = []
        p.on("console", lambda m: complaints.append(m.text) if "Content Security Policy" in m.text else None)
        for path in ("/jobs", "/fleet", "/dead-letters", "/cost"):
            p.goto(f"{ui_url}{path}")
            assert p.evaluate("() => typeof htmx") == "object", path
        wait_until(lambda: p.evaluate("() => window.tpuqCostChart !== undefined"), timeout=60, what="the chart")
        p.goto(f"{ui_url}/jobs")
        wait_until(lambda: p.evaluate("() => window.__polled || (document.body.addEventListener("
                                      "'htmx:afterSwap', () => { window.__polled = true }), false)"),
                   timeout=60, what="a poll swapped in under the policy")
        assert complaints == []
    finally:
        context.close()
