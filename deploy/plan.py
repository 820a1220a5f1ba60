"""plan(target, infra, state) -> list[Action]: what `tpuq deploy` will do, computed without any I/O.

An Action carries the exact REST request that apply sends (or, for a role, the grant that apply merges
into the resource's IAM policy by read-modify-write, so nothing else in a policy is ever lost).
`check` and `todo` actions send nothing: a check was read from the project; a todo is for a person,
e.g. the network settings of 16+ host slices, which tpuq never changes.
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

from tpuq.deploy import generated_secrets, job_buckets, network
from tpuq.deploy.infra import Infra
from tpuq.deploy.model import Action, IamResource, NetworkFacts, ProjectState, Request, Target
from tpuq.deploy.subscriptions import hold_subscription_actions, subscription_actions
from tpuq.contracts.fleet import FleetFile
from tpuq.contracts import topology
from tpuq.contracts.tputypes import zone_region

RUN_PORT = 8080
NETWORK = "default"  # the network the claimer's TPU VMs use


# ------------------------------------------------------------------- plan
def plan(target: Target, infra: Infra, state: ProjectState, skip_services: bool = False) -> list[Action]:
    target = _with_number(target, state)
    p = target.project
    actions: list[Action] = []
    actions += _apis(infra, state, p)
    actions += _firestore(target, infra, state)
    actions += _service_accounts(target, infra, state)
    actions += _service_agents(target, infra, state)  # before any grant to them
    actions += _topics(infra, state, p, target.labels)
    actions += _bucket(target, infra, state)
    actions += generated_secrets.actions(target, infra, state)  # before the grants on them and what mounts them
    actions += _grants(target, infra, state, lambda on: not on.startswith(("run_service:", "subscription:")))
    actions += _artifact_repository(target, infra, state)  # before the images are pushed (cloudbuild.yaml)
    if not skip_services:
        actions += _run_services(target, infra, state)
        actions += _grants(target, infra, state, lambda on: on.startswith("run_service:"))
        actions += subscription_actions(target, infra, state)
        actions += _scheduler_jobs(target, infra, state)
    actions += hold_subscription_actions(infra, state, p, target.labels)
    actions += _grants(target, infra, state, lambda on: on.startswith("subscription:"))  # once they exist
    actions += _notifications(target, infra, state)
    if state.stored_fleet_version != target.fleet.version:
        actions.append(Action("store", f"fleet {target.fleet.name}", f"in Firestore fleets/{target.fleet.name} "
                              f"(version {target.fleet.version})",
                              Request("fleetstore", "STORE", target.fleet.name, body=target.fleet.model_dump(mode="json"))))
    actions += _secrets_todo(target, state)
    actions += _cloud_build_check(target, infra, state)
    actions += _network_checks(target, state)
    actions += network.checks(target, state)
    actions += job_buckets.todos(target, infra, state)
    return actions


def _with_number(target: Target, state: ProjectState) -> Target:
    if state.project_number and not target.project_number:
        return replace(target, project_number=state.project_number)
    return target


def _apis(infra: Infra, state: ProjectState, p: str) -> list[Action]:
    return [Action("enable", f"API {api}", request=Request("serviceusage", "POST", f"projects/{p}/services/{api}:enable",
                                                          body={}))
            for api in infra.apis.apis if api not in state.enabled_apis]


def _firestore(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    fs, p = infra.firestore, target.project
    out = []
    if fs.database not in state.firestore_databases:
        out.append(Action("create", f"Firestore database {fs.database}", f"({fs.type}, location {fs.location})",
                          Request("firestore", "POST", f"projects/{p}/databases", {"databaseId": fs.database},
                                  {"locationId": fs.location, "type": fs.type})))
    have = {_index_key(i) for i in state.firestore_indexes}
    for index in fs.indexes:
        if _index_key(index) in have:
            continue
        cg = index["collectionGroup"]
        fields = ", ".join(f"{f['fieldPath']} {f.get('order', f.get('arrayConfig', '')).lower()}" for f in index["fields"])
        out.append(Action("create", f"Firestore index {cg}", f"({fields})",
                          Request("firestore", "POST", f"projects/{p}/databases/{fs.database}/collectionGroups/{cg}/indexes",
                                  body={"queryScope": index.get("queryScope", "COLLECTION"), "fields": index["fields"]})))
    return out


def _index_key(index: dict) -> tuple:
    cg = index.get("collectionGroup") or index.get("name", "").split("/collectionGroups/")[-1].split("/")[0]
    fields = tuple((f["fieldPath"], f.get("order") or f.get("arrayConfig")) for f in index.get("fields", [])
                   if f["fieldPath"] != "__name__")  # Firestore appends __name__ to what it lists
    return cg, index.get("queryScope", "COLLECTION"), fields


def _service_accounts(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    return [Action("create", f"service account {target.sa_email(sa.id)}", f"({sa.display_name})",
                   Request("iam", "POST", f"projects/{target.project}/serviceAccounts",
                           body={"accountId": sa.id, "serviceAccount": {"displayName": sa.display_name,
                                                                        "description": target.marker}}))
            for sa in infra.iam.service_accounts if target.sa_email(sa.id) not in state.service_accounts]


def _topics(infra: Infra, state: ProjectState, p: str, labels: dict[str, str] | None = None) -> list[Action]:
    return [Action("create", f"topic {t.name}", request=Request("pubsub", "PUT", f"projects/{p}/topics/{t.name}",
                                                                body={"labels": labels} if labels else {}))
            for t in infra.pubsub.topics if t.name not in state.topics]


def _lifecycle_body(infra_bucket) -> dict:
    rules = []
    for r in infra_bucket.lifecycle:
        condition: dict[str, Any] = {"age": r.age_days}
        if r.matches_prefix:
            condition["matchesPrefix"] = list(r.matches_prefix)
        if r.matches_suffix:
            condition["matchesSuffix"] = list(r.matches_suffix)
        rules.append({"action": {"type": r.action}, "condition": condition})
    return {"rule": rules}


def _bucket_name(target: Target, bucket_id: str) -> str:
    if bucket_id != "runner":
        raise ValueError(f"infra/storage.yaml: unknown bucket id {bucket_id!r} (only 'runner')")
    return target.runner_bucket


def _bucket(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    out = []
    for b in infra.storage.buckets:
        name = _bucket_name(target, b.id)
        lifecycle = _lifecycle_body(b)
        rules = "; ".join(f"{r['action']['type'].lower()} {'+'.join(r['condition'].get('matchesPrefix', []))}"
                          f"*{'|'.join(r['condition'].get('matchesSuffix', []))} after {r['condition']['age']} days"
                          for r in lifecycle["rule"])
        current = state.buckets.get(name)
        if current is None:
            out.append(Action("create", f"bucket gs://{name}", f"(location {b.location}, uniform access; lifecycle: {rules})",
                              Request("storage", "POST", "b", {"project": target.project},
                                      {"name": name, "location": b.location, "lifecycle": lifecycle, "labels": target.labels,
                                       "iamConfiguration": {"uniformBucketLevelAccess": {"enabled":
                                                                                         b.uniform_bucket_level_access}}})))
        elif (current.get("lifecycle") or {"rule": []}) != lifecycle:
            out.append(Action("update", f"bucket gs://{name}", f"lifecycle: {rules}",
                              Request("storage", "PATCH", f"b/{name}", body={"lifecycle": lifecycle})))
    return out


def _notifications(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    out = []
    for n in infra.storage.notifications:
        bucket = _bucket_name(target, n.bucket)
        topic = f"//pubsub.googleapis.com/projects/{target.project}/topics/{n.topic}"
        exists = any(c.get("topic", "").endswith(f"projects/{target.project}/topics/{n.topic}")
                     and c.get("object_name_prefix", "") == n.object_name_prefix
                     and sorted(c.get("event_types") or []) == sorted(n.event_types)
                     for c in state.notifications.get(bucket, []))
        if not exists:
            out.append(Action("create", f"notification gs://{bucket}/{n.object_name_prefix}",
                              f"→ topic {n.topic} ({', '.join(n.event_types)})",
                              Request("storage", "POST", f"b/{bucket}/notificationConfigs",
                                      body={"topic": topic, "payload_format": "JSON_API_V1",
                                            "event_types": list(n.event_types),
                                            "object_name_prefix": n.object_name_prefix})))
    return out


def _artifact_repository(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    repo = infra.services.artifact_repository
    if repo in state.artifact_repositories:
        return []
    return [Action("create", f"Artifact Registry repository {repo}", f"(Docker, {target.region})",
                   Request("artifactregistry", "POST", f"projects/{target.project}/locations/{target.region}/repositories",
                           {"repositoryId": repo}, {"format": "DOCKER", "description": "tpuq service images",
                                                    "labels": target.labels}))]


def desired_run_service(target: Target, infra: Infra, name: str, existing_secrets: set[str] | None = None) -> dict:
    """The run v2 Service body. A secret file whose secret is not in `existing_secrets` (when given) is left out:
    Cloud Run refuses a revision that mounts a missing secret, so the deploy would stop halfway; the todo line
    says to create it, and the next deploy mounts it."""
    spec = infra.services.service(name)
    url = target.service_url(infra, name)
    env = {"GOOGLE_CLOUD_PROJECT": target.project, "TPUQ_RUNNER_BUCKET": target.runner_bucket,
           "TPUQ_FLEET": target.fleet.name, "TPUQ_SERVICE": name, **infra.server_env(name), **spec.env}
    if name in topology.SERVICES:  # a push service; the dashboard (ui) is reached by people, never by a push
        env |= {"TPUQ_PUSH_AUTH": "oidc", "TPUQ_PUSH_AUDIENCE": url,
                "TPUQ_PUSH_SERVICE_ACCOUNT": target.sa_email(infra.pubsub.push_service_account)}
    container: dict[str, Any] = {
        "image": infra.services.image.replace("${service}", name),
        "ports": [{"containerPort": RUN_PORT}],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        # cpuIdle must be given whenever resources are: left out, run v2 takes it as false (CPU always allocated).
        "resources": {"limits": {"cpu": spec.cpu, "memory": spec.memory}, "cpuIdle": not spec.cpu_always_allocated},
    }
    template: dict[str, Any] = {
        "serviceAccount": target.sa_email(spec.service_account),
        "timeout": f"{infra.request_timeout_seconds(name)}s",
        "maxInstanceRequestConcurrency": spec.concurrency,
        # min 0 (the default): nothing runs when idle
        "scaling": {"minInstanceCount": spec.min_instances, "maxInstanceCount": spec.max_instances},
        "containers": [container],
    }
    secret_files = [f for f in spec.secret_files if existing_secrets is None or f.secret in existing_secrets]
    if secret_files:
        template["volumes"] = [{"name": f"secret-{i}", "secret": {"secret": f.secret,
                                                                  "items": [{"path": f.file, "version": "latest"}]}}
                               for i, f in enumerate(secret_files)]
        container["volumeMounts"] = [{"name": f"secret-{i}", "mountPath": f.mount_dir}
                                     for i, f in enumerate(secret_files)]
    if spec.vpc_egress:
        access = network.executor_vpc_access(target.fleet)
        if access:
            template["vpcAccess"] = access
    # The services trust a token whose signature Cloud Run removed only because its invoker check ran (tpuq.runtime.auth).
    return {"template": template, "ingress": "INGRESS_TRAFFIC_ALL", "labels": target.labels,
            "invokerIamDisabled": False}


def run_projection(body: dict) -> dict:
    t = body.get("template") or {}
    c = (t.get("containers") or [{}])[0]
    return {
        "image": c.get("image"), "env": {e["name"]: e.get("value") for e in c.get("env") or []},
        "limits": (c.get("resources") or {}).get("limits"), "serviceAccount": t.get("serviceAccount"),
        "timeout": t.get("timeout"), "concurrency": t.get("maxInstanceRequestConcurrency"),
        "maxInstances": (t.get("scaling") or {}).get("maxInstanceCount"),
        "minInstances": (t.get("scaling") or {}).get("minInstanceCount") or 0,
        "cpuIdle": (c.get("resources") or {}).get("cpuIdle", False),
        "volumes": [(v.get("secret") or {}).get("secret") for v in t.get("volumes") or []],
        "mounts": [m.get("mountPath") for m in c.get("volumeMounts") or []],
        "vpcAccess": network.vpc_access_projection(t.get("vpcAccess")),
        "invokerIamDisabled": bool(body.get("invokerIamDisabled")),
    }


EXECUTOR = "executor"  # the service that mounts the fleet's ssh_key_secret (infra/services.yaml)


def executor_key_missing(target: Target, state: ProjectState) -> bool:
    """The executor's SSH private key would not be mounted: the fleet names no ssh_key_secret, or the project was
    read and holds no such secret. Such an executor reaches no worker, so every attempt given to it would wait
    until the scheduler gave up on it: it is not deployed (a todo says what to create) until the key exists.
    Unknown (a plan without the project read) is not missing."""
    name = target.fleet.ssh_key_secret
    return state.secrets is not None and (not name or name not in state.secrets)


def _left_out(target: Target, state: ProjectState) -> set[str]:
    """The Cloud Run services (their names in infra/services.yaml) this deploy neither creates nor updates."""
    return {EXECUTOR} if executor_key_missing(target, state) else set()


def _run_services(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    out = []
    base = f"projects/{target.project}/locations/{target.region}/services"
    left_out = _left_out(target, state)
    for spec in infra.services.services:
        if spec.name in left_out:
            continue  # _secrets_todo says why and what to create
        body = desired_run_service(target, infra, spec.name, secrets_after(infra, state))
        image = body["template"]["containers"][0]["image"]
        detail = f"(image {image}, as {body['template']['serviceAccount']}, scales 0..{spec.max_instances})"
        current = state.run_services.get(spec.run_service)
        if current is None:
            out.append(Action("create", f"Cloud Run service {spec.run_service}", detail,
                              Request("run", "POST", base, {"serviceId": spec.run_service}, body)))
        elif run_projection(current) != run_projection(body):
            out.append(Action("update", f"Cloud Run service {spec.run_service}", detail,
                              Request("run", "PATCH", f"{base}/{spec.run_service}", body=body)))
    return out


def _scheduler_jobs(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    out = []
    parent = f"projects/{target.project}/locations/{target.region}"
    for job in infra.scheduler.jobs:
        body = {"name": f"{parent}/jobs/{job.name}", "description": target.marker, "schedule": job.schedule,
                "timeZone": job.time_zone,
                "pubsubTarget": {"topicName": f"projects/{target.project}/topics/{job.topic}",
                                 "data": base64.b64encode(json.dumps(job.data, sort_keys=True).encode()).decode()}}
        detail = f"({job.schedule} {job.time_zone} → topic {job.topic})"
        current = state.scheduler_jobs.get(job.name)
        if current is None:
            out.append(Action("create", f"Cloud Scheduler job {job.name}", detail,
                              Request("scheduler", "POST", f"{parent}/jobs", body=body)))
        elif any(current.get(k) != body[k] for k in ("schedule", "timeZone", "pubsubTarget")):
            out.append(Action("update", f"Cloud Scheduler job {job.name}", detail,
                              Request("scheduler", "PATCH", f"{parent}/jobs/{job.name}", body=body)))
    return out


def iam_resource(target: Target, infra: Infra, on: str) -> IamResource:
    p = target.project
    kind, _, name = on.partition(":")
    if kind == "project":
        return IamResource(on, f"project {p}", "crm", Request("crm", "POST", f"projects/{p}:getIamPolicy",
                                                              body={"options": {"requestedPolicyVersion": 3}}),
                           "POST", f"projects/{p}:setIamPolicy")
    if kind == "topic":
        path = f"projects/{p}/topics/{name}"
        return IamResource(on, f"topic {name}", "pubsub", Request("pubsub", "GET", f"{path}:getIamPolicy"),
                           "POST", f"{path}:setIamPolicy")
    if kind == "subscription":
        path = f"projects/{p}/subscriptions/{name}"
        return IamResource(on, f"subscription {name}", "pubsub", Request("pubsub", "GET", f"{path}:getIamPolicy"),
                           "POST", f"{path}:setIamPolicy")
    if kind in ("bucket", "job_bucket"):
        bucket = _bucket_name(target, name) if kind == "bucket" else name
        return IamResource(on, f"bucket gs://{bucket}", "storage", Request("storage", "GET", f"b/{bucket}/iam"),
                           "PUT", f"b/{bucket}/iam", wrap_policy=False)
    if kind == "secret":
        path = f"projects/{p}/secrets/{name}"
        return IamResource(on, f"secret {name}", "secretmanager",
                           Request("secretmanager", "GET", f"{path}:getIamPolicy"), "POST", f"{path}:setIamPolicy")
    if kind == "service_account":
        path = f"projects/{p}/serviceAccounts/{target.sa_email(name)}"
        return IamResource(on, f"service account {target.sa_email(name)}", "iam",
                           Request("iam", "POST", f"{path}:getIamPolicy", body={}), "POST", f"{path}:setIamPolicy")
    if kind == "run_service":
        run_name = infra.services.service(name).run_service
        path = f"projects/{p}/locations/{target.region}/services/{run_name}"
        return IamResource(on, f"Cloud Run service {run_name}", "run", Request("run", "GET", f"{path}:getIamPolicy"),
                           "POST", f"{path}:setIamPolicy")
    raise ValueError(f"infra/iam.yaml: cannot grant on {on!r}")


def _granted(target: Target, state: ProjectState, binding) -> bool:
    return (binding.role, target.member(binding.member)) in state.iam.get(binding.resource, set())


def secrets_after(infra: Infra, state: ProjectState) -> set[str]:
    """The secrets the project holds once this deploy made its own (those in infra/services.yaml with random_bytes)."""
    return (state.secrets or set()) | set(generated_secrets.declared(infra))


def _grants(target: Target, infra: Infra, state: ProjectState, which) -> list[Action]:
    out = []
    absent_services = {f"run_service:{name}" for name in _left_out(target, state)
                       if infra.services.service(name).run_service not in state.run_services}
    for b in infra.iam.bindings:
        if not which(b.resource) or b.resource.partition(":")[2] in state.missing_buckets:
            continue  # a job bucket that is not there is a todo (tpuq.deploy.job_buckets), not a failed grant
        if b.resource.startswith("job_bucket:") and b.resource.partition(":")[2] in state.unreadable_job_buckets:
            continue  # nor is one whose policy deploy may not read: its owner grants (tpuq.deploy.job_buckets)
        if b.resource in absent_services:
            continue  # a service left out of this deploy has no IAM policy to grant on yet
        member = target.member(b.member)
        if _granted(target, state, b):
            continue
        if b.resource.startswith("secret:") and b.resource.split(":", 1)[1] not in secrets_after(infra, state):
            continue  # a secret tpuq never creates: granted on a later deploy, once it exists (_secrets_todo)
        resource = iam_resource(target, infra, b.resource)
        out.append(Action("grant", b.role, f"on {resource.label} to {member.removeprefix('serviceAccount:')}",
                          iam=resource, role=b.role, member=member))
    return out


def _service_agents(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    """Google's service agents appear when an API is first used; a grant to one that does not exist yet fails."""
    p = target.project
    wanted = {b.member.split(":", 1)[1] for b in infra.iam.bindings
              if b.member.startswith("agent:") and not _granted(target, state, b)}
    out = []
    if "pubsub" in wanted:
        out.append(Action("ensure", f"Pub/Sub service agent {target.agent_email('pubsub')}",
                          "(generateServiceIdentity: it mints the push tokens and dead-letters)",
                          Request("serviceusage_v1beta1", "POST",
                                  f"projects/{p}/services/pubsub.googleapis.com:generateServiceIdentity", body={})))
    if "storage" in wanted:
        out.append(Action("ensure", f"Cloud Storage service agent {target.agent_email('storage')}",
                          "(reading it creates it: it publishes the bucket's notifications)",
                          Request("storage", "GET", f"projects/{p}/serviceAccount")))
    return out


def _cloud_build_check(target: Target, infra: Infra, state: ProjectState) -> list[Action]:
    if not state.cloud_build_account:
        return []
    default = state.cloud_build_account.rsplit("/", 1)[-1]
    why = (" (the Compute Engine default account, which every default VM carries: give it no deploy roles)"
           if default.endswith("-compute@developer.gserviceaccount.com") else "")
    return [Action("check", "Cloud Build", f"builds that name no account run as {default}{why}; cloudbuild.yaml "
                   f"runs as {target.sa_email(infra.iam.deploy_account)}, with only the roles infra/iam.yaml gives it")]


def _secrets_todo(target: Target, state: ProjectState) -> list[Action]:
    fleet, p = target.fleet, target.project
    left_out = executor_key_missing(target, state)
    if not fleet.ssh_key_secret:
        consequence = "could reach no worker, so it is not deployed" if left_out else "cannot reach workers"
        return [Action("todo", "SSH key", f"the fleet file names no ssh_key_secret: the executor {consequence}. "
                       "Create a key pair in Secret Manager, set ssh_key_secret: tpuq-executor-ssh in the fleet file "
                       "and run tpuq deploy again",
                       commands=_ssh_secret_commands("tpuq-executor-ssh", p))]
    out = []
    if state.secrets is None or not {fleet.ssh_key_secret, fleet.ssh_key_secret + "-public"} <= state.secrets:
        word = "could not be checked" if state.secrets is None else "is missing"
        then = ("the executor could reach no worker, so it is not deployed until the secret exists; tpuq never "
                "handles secret values: create it with the commands below, then run tpuq deploy again, which deploys "
                "the executor and grants it and the claimer access" if left_out else
                "tpuq never handles secret values, so create it yourself if needed; the executor's and claimer's "
                "access to it is granted when you run tpuq deploy again")
        out.append(Action("todo", f"secret {fleet.ssh_key_secret}", f"(the executor's SSH key pair) {word}: {then}",
                          commands=_ssh_secret_commands(fleet.ssh_key_secret, p)))
    for name in [s for s in target.notify_secrets if state.secrets is None or s not in state.secrets]:
        word = "could not be checked" if state.secrets is None else "is missing"
        out.append(Action("todo", f"secret {name}", f"(a notify: destination's webhook URL) {word}: create it, or "
                          "let `tpuq fleet apply` store an inline url: for you, then run tpuq deploy again to let the "
                          "janitor read it",
                          commands=(f"printf %s \"$WEBHOOK_URL\" | gcloud secrets create {name} --data-file=- "
                                    f"--project={p}",)))
    unchecked = [s for s in fleet.worker_secrets if state.secrets is None or s not in state.secrets]
    for name in unchecked:
        word = "could not be checked" if state.secrets is None else "is missing"
        out.append(Action("todo", f"secret {name}", f"(a worker secret) {word}: create it yourself if needed, then "
                          "run tpuq deploy again to let the workers read it",
                          commands=(f"printf %s \"$VALUE\" | gcloud secrets create {name} --data-file=- --project={p}",)))
    return out


def _ssh_secret_commands(name: str, p: str) -> tuple[str, ...]:
    return (f"ssh-keygen -q -t ed25519 -N '' -C tpuq-executor -f ./{name}",
            f"gcloud secrets create {name} --data-file=./{name} --project={p}",
            f"gcloud secrets create {name}-public --data-file=./{name}.pub --project={p}",
            f"rm ./{name} ./{name}.pub")


def large_slice_regions(fleet: FleetFile) -> dict[str, list[str]]:
    """region -> the fleet entries whose nodes get internal IPs only there (16+ hosts, or worker_external_ips off)."""
    out: dict[str, list[str]] = {}
    for entry in fleet.tpus:
        acc = entry.accelerator
        if not fleet.external_ips_for(acc):
            for zone in entry.zones:
                out.setdefault(zone_region(zone), [])
                label = f"{entry.id}: {entry.type}, {acc.hosts} hosts"
                if label not in out[zone_region(zone)]:
                    out[zone_region(zone)].append(label)
    return out


def _network_checks(target: Target, state: ProjectState) -> list[Action]:
    p, out = target.project, []
    net, subnet = target.fleet.network, target.fleet.subnetwork
    for region, entries in sorted(large_slice_regions(target.fleet).items()):
        facts = state.networks.get(region, NetworkFacts())
        why = "; ".join(entries)
        if facts.private_google_access and facts.cloud_nat:
            out.append(Action("check", f"network {net} in {region}",
                              f"has Private Google Access and Cloud NAT, as nodes with internal IPs only need ({why})"))
            continue
        commands = []
        if not facts.private_google_access:
            commands.append(f"gcloud compute networks subnets update {subnet} --region={region} "
                            f"--enable-private-ip-google-access --project={p}")
        if not facts.cloud_nat:
            commands += [f"gcloud compute routers create tpuq-nat-router --network={net} --region={region} --project={p}",
                         f"gcloud compute routers nats create tpuq-nat --router=tpuq-nat-router --region={region} "
                         f"--auto-allocate-nat-external-ips --nat-all-subnet-ip-ranges --project={p}"]
        status = ", ".join(f"{name} {'unknown' if value is None else 'missing'}" for name, value in
                           (("Private Google Access", facts.private_google_access), ("Cloud NAT", facts.cloud_nat))
                           if not value)
        out.append(Action("todo", f"network {net} in {region}",
                          f"FOR THE PROJECT OWNER TO RUN (tpuq never changes network settings): {status}; these "
                          f"nodes get internal IPs only (16+ hosts, or worker_external_ips: false) and need both to "
                          f"reach Google APIs and PyPI ({why})",
                          commands=tuple(commands)))
    return out
