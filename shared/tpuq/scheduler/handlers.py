"""The scheduler service: thin handlers from topics to the pure core and the store."""

from __future__ import annotations

import logging

from tpuq.jobspec import PublishedJob
from tpuq.scheduler import intake
from tpuq.service import Context, Service

log = logging.getLogger("tpuq.scheduler")


def on_job(job: PublishedJob, ctx: Context) -> None:
    source = ctx.attributes.get("source", "pubsub")
    job_id, created = intake.store_job(ctx.clients.firestore, job, source, ctx.message_id, ctx.now())
    log.info("job %s %s (source %s)", job_id, "stored as pending" if created else "already stored", source)


def build_service() -> Service:
    return Service(name="scheduler", handlers={"/push/jobs": on_job})
