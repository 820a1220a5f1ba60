"""undeploy_plan(target, infra, state, purge) -> list[Action]: what `tpuq undeploy` removes, computed without I/O.

A resource is removed only when both marks agree: infra/ declares its exact name, and it carries what deploy
puts on everything it creates (the fleet's owner labels, or, where a resource takes no labels, the exact
description `Target.marker`). Anything else, a foreign resource of the same name included, is kept and said so.

Removed: the tick job, the Cloud Run services, the subscriptions, the bucket notifications to tpuq's topic,
the topics, the roles tpuq's own accounts hold on what survives, and those accounts (tpuq-deploy last).
Kept unless --purge: the runner bucket, the image repository and the Firestore data. Kept always: the Firestore
database itself, the secrets (the user's, and the dashboard's session key deploy made) and roles held by Google's
service agents on what survives (other resources of the project may rely on them): the plan prints the command that
removes them.
"""

from __future__ import annotations

from urllib.parse import quote

from tpuq.contracts import store
from tpuq.deploy.infra import Infra
from tpuq.deploy.model import Action, ProjectState, Request, Target
from tpuq.deploy.plan import _bucket_name, _index_key, _with_number, iam_resource
from tpuq.deploy.subscriptions import owned

KEEP = "keep"


def _labelled(resource: dict | None, target: Target) -> bool:
    return owned(resource, target)


def _described(resource: dict | None, target: Target) -> bool:
    return (resource or {}).get("description") == target.marker


def _not_ours(kind: str, name: str, how: str) -> Action:
    return Action(KEEP, f"{kind} {name}", f"(not created by tpuq deploy: {how})")


def undeploy_plan(target: Target, infra: Infra, state: ProjectState, purge: bool = False) -> list[Action]:
    target = _with_number(target, state)
    p, region = target.project, target.region
    parent = f"projects/{p}/locations/{region}"
    out: list[Action] = []
    gone: set[str] = set()  # iam.yaml resource keys of what is deleted (its policy goes with it)
    label_text = ", ".join(f"{k}={v}" for k, v in target.labels.items())

    for job in infra.scheduler.jobs:
        current = state.scheduler_jobs.get(job.name)
        if current is None:
            continue
        if _described(current, target):
            out.append(Action("delete", f"Cloud Scheduler job {job.name}", "(the tick stops first)",
                              Request("scheduler", "DELETE", f"{parent}/jobs/{job.name}")))
        else:
            out.append(_not_ours("Cloud Scheduler job", job.name, f"its description is not {target.marker!r}"))

    for spec in infra.services.services:
        current = state.run_services.get(spec.run_service)
        if current is None:
            continue
        if _labelled(current, target):
            out.append(Action("delete", f"Cloud Run service {spec.run_service}",
                              request=Request("run", "DELETE", f"{parent}/services/{spec.run_service}")))
            gone.add(f"run_service:{spec.name}")
        else:
            out.append(_not_ours("Cloud Run service", spec.run_service, f"no labels {label_text}"))

    ours_subs = {s.name for s in infra.pubsub.subscriptions} | {h.name for h in infra.pubsub.hold_subscriptions}
    deleted_subs = set()
    for name in sorted(ours_subs & set(state.subscriptions)):
        if _labelled(state.subscriptions[name], target):
            out.append(Action("delete", f"subscription {name}",
                              request=Request("pubsub", "DELETE", f"projects/{p}/subscriptions/{name}")))
            deleted_subs.add(name)
            gone.add(f"subscription:{name}")  # and its IAM policy with it
        else:
            out.append(_not_ours("subscription", name, f"no labels {label_text}"))

    bucket = _bucket_name(target, "runner")
    topic_names = {t.name for t in infra.pubsub.topics}
    for config in state.notifications.get(bucket, []):
        topic = config.get("topic", "")
        if (topic.rsplit("/", 1)[-1] in topic_names and f"projects/{p}/topics/" in topic and config.get("id")
                and any(config.get("object_name_prefix", "") == n.object_name_prefix for n in infra.storage.notifications)):
            out.append(Action("delete", f"notification gs://{bucket}/{config.get('object_name_prefix', '')}",
                              f"→ topic {topic.rsplit('/', 1)[-1]}",
                              Request("storage", "DELETE", f"b/{bucket}/notificationConfigs/{config['id']}")))

    for name in [t.name for t in infra.pubsub.topics if t.name in state.topics]:
        readers = sorted(s for s, sub in state.subscriptions.items()
                         if sub.get("topic") == f"projects/{p}/topics/{name}" and s not in deleted_subs)
        if not _labelled(state.topic_resources.get(name), target):
            out.append(_not_ours("topic", name, f"no labels {label_text}"))
        elif readers:
            out.append(Action(KEEP, f"topic {name}", f"(subscriptions tpuq did not create read from it: "
                              f"{', '.join(readers)}; deleting it would detach them)"))
        else:
            out.append(Action("delete", f"topic {name}", request=Request("pubsub", "DELETE", f"projects/{p}/topics/{name}")))
            gone.add(f"topic:{name}")

    ours_accounts = []
    for sa in infra.iam.service_accounts:
        email = target.sa_email(sa.id)
        if email not in state.service_accounts:
            continue
        if _described(state.service_account_resources.get(email), target):
            ours_accounts.append(sa.id)
            gone.add(f"service_account:{sa.id}")
        else:
            out.append(_not_ours("service account", email, f"its description is not {target.marker!r}"))

    purge_bucket = purge and owns_bucket(target, state)
    if purge_bucket:
        gone.add("bucket:runner")
    out += _revocations(target, infra, state, set(ours_accounts), gone)

    deploy_account = infra.iam.deploy_account
    for account in sorted(ours_accounts, key=lambda a: a == deploy_account):  # the deploying account last
        email = target.sa_email(account)
        out.append(Action("delete", f"service account {email}",
                          request=Request("iam", "DELETE", f"projects/{p}/serviceAccounts/{email}")))

    out += _data(target, infra, state, purge, purge_bucket, bucket, label_text)
    return out


def owns_bucket(target: Target, state: ProjectState) -> bool:
    bucket = _bucket_name(target, "runner")
    return bucket in state.buckets and _labelled(state.buckets[bucket], target)


def _revocations(target: Target, infra: Infra, state: ProjectState, accounts: set[str], gone: set[str]) -> list[Action]:
    """Roles of tpuq's own accounts on what survives are revoked; Google's service agents' roles are kept."""
    out = []
    for b in infra.iam.bindings:
        if b.resource in gone:
            continue
        member = target.member(b.member)
        if (b.role, member) not in state.iam.get(b.resource, set()):
            continue
        resource = iam_resource(target, infra, b.resource)
        kind, _, name = b.member.partition(":")
        if kind == "sa" and name in accounts:
            out.append(Action("revoke", b.role, f"on {resource.label} from {member.removeprefix('serviceAccount:')}",
                              iam=resource, role=b.role, member=member))
        elif kind == "agent":
            command = (f"gcloud projects remove-iam-policy-binding {target.project} --member={member} --role={b.role}"
                       if b.resource == "project" else "")
            out.append(Action(KEEP, f"{b.role} on {resource.label} for {member.removeprefix('serviceAccount:')}",
                              "(a Google service agent's role: other resources may rely on it; remove it yourself "
                              "if nothing does)", commands=(command,) if command else ()))
    return out


def _data(target: Target, infra: Infra, state: ProjectState, purge: bool, purge_bucket: bool, bucket: str,
          label_text: str) -> list[Action]:
    p, out = target.project, []
    if bucket in state.buckets:
        if purge_bucket:
            for name in state.bucket_objects.get(bucket, []):
                out.append(Action("delete", f"object gs://{bucket}/{name}",
                                  request=Request("storage", "DELETE", f"b/{bucket}/o/{quote(name, safe='')}")))
            out.append(Action("delete", f"bucket gs://{bucket}", "(job logs, status, submitted files)",
                              Request("storage", "DELETE", f"b/{bucket}")))
        elif purge:
            out.append(_not_ours("bucket", f"gs://{bucket}", f"no labels {label_text}"))
        else:
            out.append(Action(KEEP, f"bucket gs://{bucket}", "(logs, status and submitted jobs: --purge deletes it)"))
    repo = infra.services.artifact_repository
    if repo in state.artifact_repositories:
        if purge and _labelled(state.artifact_repository_resources.get(repo), target):
            out.append(Action("delete", f"Artifact Registry repository {repo}", "(the service images)",
                              Request("artifactregistry", "DELETE",
                                      f"projects/{p}/locations/{target.region}/repositories/{repo}")))
        elif purge:
            out.append(_not_ours("Artifact Registry repository", repo, f"no labels {label_text}"))
        else:
            out.append(Action(KEEP, f"Artifact Registry repository {repo}", "(the service images: --purge deletes it)"))
    db = infra.firestore.database
    if db in state.firestore_databases:
        if purge:
            out.append(Action("delete", f"Firestore data in {db}", f"(collections {', '.join(store.ALL_COLLECTIONS)})",
                              Request("firestore", "POST", f"projects/{p}/databases/{db}:bulkDeleteDocuments",
                                      body={"collectionIds": list(store.ALL_COLLECTIONS)})))
            declared = {_index_key(i) for i in infra.firestore.indexes}
            for index in state.firestore_indexes:
                if _index_key(index) in declared and index.get("name"):
                    out.append(Action("delete", f"Firestore index {_index_key(index)[0]}",
                                      request=Request("firestore", "DELETE", index["name"])))
            out.append(Action(KEEP, f"Firestore database {db}", "(other data may live in it: delete it yourself "
                              "if nothing else does)"))
        else:
            out.append(Action(KEEP, f"Firestore data in {db}", "(jobs, attempts, fleets: --purge deletes tpuq's "
                              "collections)"))
    return out
