"""On the whole local stack, every Google API call the services make is one their own accounts may make in Google
Cloud (issue 32 §1). The emulators and the fake Cloud TPU accept anonymous callers; the stack starts each service
under tpuq_dev.iam.recording, which records every call as the service's account, and tpuq_dev.iam.calls checks them
against the roles deploy grants (infra/iam.yaml through deploy's plan). Every stack fixture runs that check when it
stops (DevStack.running); here, a job's whole life is driven and the recording is read while the stack runs."""

from __future__ import annotations

import uuid

from tpuq.contracts import store
from tpuq.contracts.fleet import worker_service_account
from tpuq_dev.devstack.stack import wait_for
from tpuq_dev.iam import calls

DEADLINE = 300


def job(clients, job_id):
    snap = clients.firestore.collection(store.JOBS).document(job_id).get()
    return snap.to_dict() if snap.exists else {}


def wait_state(clients, job_id, states):
    return wait_for(lambda: (j := job(clients, job_id)).get("state") in states and j, timeout=DEADLINE,
                    what=f"{job_id} in {states}")


def publish(clients, **spec) -> str:
    job_id = spec.setdefault("id", f"iam-{uuid.uuid4().hex[:8]}")
    clients.publish("jobs", spec)
    return job_id


def test_submit_claim_run_finish_and_cancel_make_only_calls_each_services_account_may_make(system, system_clients):
    finished = publish(system_clients, tpu="v4-8", command="echo done")
    cancelled = publish(system_clients, tpu="v4-8", command="sleep 300")
    assert wait_state(system_clients, finished, ("succeeded", "failed"))["state"] == "succeeded"
    wait_state(system_clients, cancelled, ("running",))
    system_clients.publish("cancels", {"job_id": cancelled})
    wait_state(system_clients, cancelled, ("cancelled",))

    recorded = calls.read(system.iam_calls_file)
    endpoints = calls.stack_endpoints(system.env)
    by_account = calls.methods_by_account(recorded, endpoints)
    account = {name: system.service_account(name) for name in system.services}
    assert set(account.values()) <= set(by_account), sorted(by_account)  # every service called, as its own account
    assert {"tpu.projects.locations.queuedResources.create", "tpu.projects.locations.queuedResources.get",
            "firestore.projects.databases.documents.commit"} <= by_account[account["claimer"]]
    assert {"storage.objects.list", "pubsub.projects.topics.publish"} <= by_account[account["executor"]]
    assert {"firestore.projects.databases.documents.runQuery", "pubsub.projects.topics.publish"} <= \
        by_account[account["scheduler"]]
    assert "" not in set().union(*by_account.values())  # each call has its row

    project = calls.stack_project(system)
    assert calls.blocking(calls.refusals(recorded, project, endpoints)) == []

    # Not vacuous: without its grant on the workers' account, each create the claimer made is refused, by name.
    worker = worker_service_account(system.project)
    project.bindings = {b for b in project.bindings if not (b[0].kind == "service_account" and b[0].name == worker)}
    refused = calls.blocking(calls.refusals(recorded, project, endpoints))
    assert {(r.method, r.permission, r.principal) for r in refused} == {
        ("tpu.projects.locations.queuedResources.create", "iam.serviceAccounts.actAs",
         f"serviceAccount:{account['claimer']}")}
    assert f"{account['claimer']} lacks iam.serviceAccounts.actAs on service account {worker}" in str(refused[0])
