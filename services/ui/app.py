"""Shell: the dashboard's Flask app, over the read paths the CLI uses (tpuq.operations.queries, tpuq.operations.fleetreport,
tpuq.operations.deadletters, the client layer's job reader tpuq.operations.jobreader, tpuq.operations.jobwatch) and its two changes
(`tpuq cancel`'s and `tpuq set-priority`'s code: tpuq.operations.jobs.request_cancel, change_priority).

Server-rendered (Jinja, autoescaped: a job's name or a log line is text, never markup). Pages that change poll a
fragment of themselves with htmx (`hx-trigger="every Ns"`) and swap it in; a job's fragment stops polling once
the job ended. Mutations are POSTs behind a confirmation page, each carrying the session's CSRF token (403
without it, or with another), made as the authenticated user (401 without one: tpuq.ui.identity).

`create_app(clients_factory, now, user_of, ...)`: the clients are made on the first request, the clock and the
user's identity are passed in. Nothing connects at import time.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from datetime import datetime, timezone, tzinfo
from typing import Any

from flask import Flask, abort, g, redirect, render_template, request, session, url_for

from tpuq.ui import pages
from tpuq.ui.identity import UserOf

CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
JOBS_POLL_SECONDS = 2
JOB_POLL_SECONDS = 1
FLEET_POLL_SECONDS = 5


def create_app(clients_factory: Callable[[], Any], now: Callable[[], datetime], user_of: UserOf,
               tz: tzinfo = timezone.utc, secret_key: bytes | str | None = None, backend_line: str = "") -> Flask:
    """The dashboard. `clients_factory()`: a `tpuq.runtime.clients.Clients` (called once, on the first request);
    `now()`: aware datetimes; `user_of(headers)`: the user's account or None; `tz`: the zone times are shown in;
    `secret_key`: signs the session cookie; every process serving the same users must share it (tpuq.ui.sessionkey),
    or one refuses the others' forms. Not given: random per process, and a restart asks for a reload;
    `backend_line`: where it reads from, shown in the footer."""
    app = Flask(__name__)
    app.config.update(SECRET_KEY=secret_key or secrets.token_hex(32), SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Strict")
    made: dict[str, Any] = {}

    def clients():
        if "clients" not in made:
            made["clients"] = clients_factory()
        return made["clients"]

    def prechecks():
        if "prechecks" not in made:
            made["prechecks"] = pages.CachedPrechecks.of(clients())
        return made["prechecks"]

    def csrf_token() -> str:
        if CSRF_FIELD not in session:
            session[CSRF_FIELD] = secrets.token_urlsafe(32)
        return session[CSRF_FIELD]

    @app.context_processor
    def _common() -> dict[str, Any]:
        return {"csrf_token": csrf_token(), "user": g.get("user"), "backend_line": backend_line,
                "nav": request.endpoint}

    @app.before_request
    def _identify() -> None:
        g.user = user_of(dict(request.headers))
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            sent = request.form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER) or ""
            expected = session.get(CSRF_FIELD) or ""
            if not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
                abort(403, "the form's CSRF token is missing or not this session's: reload the page and try again")
            if not g.user:
                abort(401, "no authenticated user: the dashboard changes nothing for an anonymous request")

    @app.after_request
    def _headers(response):
        # No inline script runs (every script is a static file of ours): a name or log line that got through as
        # markup still could not execute.
        response.headers.setdefault("Content-Security-Policy",
                                    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                    "img-src 'self' data:; frame-ancestors 'none'")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

    @app.errorhandler(401)
    @app.errorhandler(403)
    @app.errorhandler(404)
    def _refused(e):
        return render_template("error.html", code=e.code, message=e.description), e.code

    @app.get("/")
    def index():
        return redirect(url_for("jobs"))

    @app.get("/jobs")
    def jobs():
        return render_template("jobs.html", **pages.jobs_page(clients(), now(), tz, request.args),
                               poll=JOBS_POLL_SECONDS)

    @app.get("/jobs/rows")
    def job_rows():
        return render_template("_job_rows.html", **pages.jobs_page(clients(), now(), tz, request.args),
                               poll=JOBS_POLL_SECONDS)

    @app.get("/jobs/<job_id>")
    def job(job_id: str):
        return render_template("job.html", **_job_or_404(job_id), poll=JOB_POLL_SECONDS)

    @app.get("/jobs/<job_id>/live")
    def job_live(job_id: str):
        return render_template("_job_live.html", **_job_or_404(job_id), poll=JOB_POLL_SECONDS)

    def _job_or_404(job_id: str) -> dict[str, Any]:
        view = pages.job_page(clients(), job_id, now(), tz, request.args.get("worker"), request.args.get("attempt"))
        if view is None:
            abort(404, f"no job {job_id!r}")
        return view

    @app.get("/groups/<group>")
    def group(group: str):
        return render_template("group.html", **_group_or_404(group), poll=JOB_POLL_SECONDS)

    @app.get("/groups/<group>/live")
    def group_live(group: str):
        return render_template("_group_live.html", **_group_or_404(group), poll=JOB_POLL_SECONDS)

    def _group_or_404(group: str) -> dict[str, Any]:
        view = pages.group_page(clients(), group)
        if view is None:
            abort(404, f"no group {group!r}")
        return view

    @app.get("/jobs/<job_id>/cancel")
    def confirm_cancel(job_id: str):
        view = _job_or_404(job_id)
        return render_template("confirm.html", action="cancel", job=view["job"],
                               refusal=pages.cancel_refusal_of(view["job"], g.user))

    @app.post("/jobs/<job_id>/cancel")
    def do_cancel(job_id: str):
        message, ok = pages.cancel(clients(), job_id, g.user, force=request.form.get("force") == "on")
        return render_template("done.html", job_id=job_id, message=message, ok=ok), (200 if ok else 409)

    @app.get("/jobs/<job_id>/priority")
    def confirm_priority(job_id: str):
        view = _job_or_404(job_id)
        wanted = request.args.get("priority", "")
        if wanted not in pages.PRIORITIES:
            abort(404, f"priority {wanted!r} is not one of {', '.join(pages.PRIORITIES)}")
        return render_template("confirm.html", action="priority", job=view["job"], priority=wanted, refusal=None)

    @app.post("/jobs/<job_id>/priority")
    def do_priority(job_id: str):
        message, ok = pages.set_priority(clients(), job_id, request.form.get("priority", ""), now())
        return render_template("done.html", job_id=job_id, message=message, ok=ok), (200 if ok else 409)

    @app.get("/fleet")
    def fleet():
        return render_template("fleet.html", fleets=pages.fleet_page(clients(), now(), tz, prechecks()),
                               notify=pages.notify_failing(clients(), now()), poll=FLEET_POLL_SECONDS)

    @app.get("/fleet/live")
    def fleet_live():
        return render_template("_fleet_live.html", fleets=pages.fleet_page(clients(), now(), tz, prechecks()),
                               notify=pages.notify_failing(clients(), now()), poll=FLEET_POLL_SECONDS)

    @app.get("/dead-letters")
    def dead_letters():
        return render_template("dead_letters.html", **pages.dead_letters_page(clients(), tz, request.args))

    @app.get("/cost")
    def cost():
        return render_template("cost.html", **pages.cost_page(clients(), now(), request.args))

    return app
