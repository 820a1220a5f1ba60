"""Core (pure): one row per Google API method tpuq sends, with the IAM permissions it needs and where that is written.

A row names the method by its discovery id (`tests/deploy/test_iam_model.py` checks each row's URL template against
the discovery document of that id, so a row cannot describe a path Google does not have) and lists:
- `needs`: each permission and the resource it is checked on: the resource in the URL (a `{topic}`, `{bucket}`,
  `{secret}`, `{service_account}` or `{run_service}` segment), the project, or a resource named in the body;
- `acts_as`: the body fields that attach a service account to what the request creates. The caller needs
  `iam.serviceAccounts.actAs` on each (production-facts.md, "actAs"; Cloud Run, "Configure service identity");
- `identity_needs`: what the attached identity itself must hold for the create to succeed (a Cloud Run revision's
  account must read the secrets it mounts; Cloud Storage's agent must publish to a notification's topic);
- `advisory`: set when deploy reads the answer tolerantly and a refusal only costs a check line (a "could not be
  checked" todo), never a wrong plan or a failed apply.

Where the permission comes from, per row (`source`): the API's REST reference page (its "IAM Permissions" block) or
the service's access-control page, as stored copies read on 2026-12 showed them, cross-read against
github.com/iann0036/iam-dataset `gcp/map.json` (commit 2073fa52, a crawl of those same blocks). The general
reference for every permission named here is https://cloud.google.com/iam/docs/permissions-reference.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any

PERMISSIONS_REFERENCE = "https://cloud.google.com/iam/docs/permissions-reference"
ACT_AS = "iam.serviceAccounts.actAs"

# URL template variables that name a resource IAM policies can be set on; any other variable ({project},
# {location}, {api}, ...) names no such resource, and a permission checked there is checked on the project.
RESOURCE_VARIABLES = {"topic": "topic", "subscription": "subscription", "bucket": "bucket", "secret": "secret",
                      "service_account": "service_account", "run_service": "run_service"}


@dataclass(frozen=True)
class On:
    """Where a permission is checked: `resource` (the URL's), `project`, a resource of `kind` named at a body path, or
    (`url:VARIABLE`) the resource of `kind` another URL variable names (a rewrite's destination bucket)."""

    where: str = "resource"
    kind: str = ""


PROJECT = On("project")


@dataclass(frozen=True)
class Need:
    permission: str
    on: On = On()
    when: str = ""  # a key of CONDITIONS: needed only by a request it holds for; "" always


def _writes(body: Any) -> list[dict]:
    return [w for w in (body or {}).get("writes") or [] if isinstance(w, dict)]


def _sets(write: dict) -> bool:
    return "update" in write or "transform" in write


def _exists(write: dict) -> Any:
    return (write.get("currentDocument") or {}).get("exists")


def _updates_existing(write: dict) -> bool:
    condition = write.get("currentDocument") or {}
    return _sets(write) and (condition.get("exists") is not False)  # exists: true, updateTime, or none (an upsert)


# Conditions on the request (query, body) under which a Need applies; each says when, with its source.
# Firestore: https://cloud.google.com/firestore/docs/security/iam ("Required permissions for API methods": a commit's
# update or transform with exists=false needs create, with exists=true update, with no precondition both; a delete
# needs delete; a commit with no write needs datastore.databases.get, as beginTransaction and rollback do).
# Cloud Storage: https://cloud.google.com/storage/docs/access-control/iam-json (objects.insert: storage.objects.delete
# too when it replaces an object; the model cannot see whether the object exists, so any insert that may replace one,
# i.e. without ifGenerationMatch=0, needs it).
CONDITIONS: dict[str, Callable[[dict, Any], bool]] = {
    "a write may create a document": lambda query, body: any(_sets(w) and _exists(w) is not True
                                                             for w in _writes(body)),
    "a write may update a document": lambda query, body: any(_updates_existing(w) for w in _writes(body)),
    "a write deletes a document": lambda query, body: any("delete" in w for w in _writes(body)),
    "no write": lambda query, body: not _writes(body),
    "it may replace an object": lambda query, body: str((query or {}).get("ifGenerationMatch")) != "0",
}


@dataclass(frozen=True)
class IdentityNeed:
    """The identity a request attaches (at `identity`, a body path, or `agent:storage`) must hold `permission` on
    each resource of `kind` named at body path `resource_path`."""

    identity: str
    permission: str
    kind: str
    resource_path: str
    source: str


@dataclass(frozen=True)
class Method:
    id: str  # the discovery document's method id
    http_method: str
    url: str  # full URL; each {variable} is one path segment
    needs: tuple[Need, ...]
    source: str
    acts_as: tuple[str, ...] = ()  # body paths ("a.b[].c") holding a service account email the request attaches
    identity_needs: tuple[IdentityNeed, ...] = ()
    effect: str = ""  # grant (setIamPolicy, merged as deploy's read-modify-write) | create_bucket
    advisory: str = ""  # why a refusal only costs a check line
    grpc: str = ""  # the same method's full gRPC name, as Google's gRPC clients call it (tpuq_dev.iam.calls)

    @cached_property
    def pattern(self) -> re.Pattern:
        out, pos = [], 0
        for m in re.finditer(r"\{([a-z_]+)\}", self.url):
            out.append(re.escape(self.url[pos:m.start()]))
            out.append(f"(?P<{m.group(1)}>[^/:?]+)")
            pos = m.end()
        out.append(re.escape(self.url[pos:]))
        return re.compile("".join(out))


def _p(*permissions: str, on: On = On()) -> tuple[Need, ...]:
    return tuple(Need(p, on) for p in permissions)


SERVICE_USAGE = "https://cloud.google.com/service-usage/docs/access-control (IAM permissions table)"
CRM = "https://cloud.google.com/resource-manager/docs/access-control-proj"
IAM_SA = ("https://cloud.google.com/iam/docs/service-accounts-create#permissions, "
          "https://cloud.google.com/iam/docs/manage-access-service-accounts")
PUBSUB = "https://cloud.google.com/pubsub/docs/access-control (permissions required by each method)"
PUSH_AUTH = "https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions (actAs on the push account)"
STORAGE = "https://cloud.google.com/storage/docs/access-control/iam-json"
NOTIFY = "https://cloud.google.com/storage/docs/reporting-changes (Get required roles)"
ARTIFACT = "https://cloud.google.com/artifact-registry/docs/access-control#permissions"
RUN = "https://cloud.google.com/run/docs/reference/iam/permissions"
RUN_IDENTITY = "https://cloud.google.com/run/docs/configuring/services/service-identity (the deployer needs actAs)"
RUN_SECRETS = ("https://cloud.google.com/run/docs/configuring/services/secrets (the service identity needs "
               "roles/secretmanager.secretAccessor on each secret it mounts, or the revision is refused)")
SCHEDULER = ("https://cloud.google.com/scheduler/docs/access-control; cloudscheduler v1 discovery, OidcToken: "
             "\"The caller must have iam.serviceAccounts.actAs permission for the service account\"")
FIRESTORE = ("https://firebase.google.com/docs/firestore/security/iam (\"The datastore.schemas.* permissions were "
             "previously named datastore.indexes.*\"; gcloud's role definitions of 2026-02 carry only schemas.*)")
SECRETS = "https://cloud.google.com/secret-manager/docs/access-control"
SECRET_ACCESS = ("https://cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets.versions/access "
                 "(\"Authorization requires the following IAM permission on the specified resource name: "
                 "secretmanager.versions.access\")")
SECRET_WRITES = ("https://cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets (create, addVersion; "
                 "versions/list): \"Authorization requires the following IAM permission on the specified resource "
                 "parent\": secretmanager.secrets.create, secretmanager.versions.add, secretmanager.versions.list")
FIRESTORE_METHODS = "https://cloud.google.com/firestore/docs/security/iam (Required permissions for API methods)"
FIRESTORE_WRITE_NEEDS = (Need("datastore.entities.create", when="a write may create a document"),
                         Need("datastore.entities.update", when="a write may update a document"),
                         Need("datastore.entities.delete", when="a write deletes a document"),
                         Need("datastore.databases.get", when="no write"))
COMPUTE = "https://cloud.google.com/compute/docs/reference/rest/v1 (each method's IAM block)"
NETWORK_ADVISORY = "tolerant read: refused, deploy prints the network/OS Login check as 'could not be checked'"

RUN_ATTACHES = ("template.serviceAccount",)
RUN_SECRET_ACCESS = IdentityNeed("template.serviceAccount", "secretmanager.versions.access", "secret",
                                 "template.volumes[].secret.secret", RUN_SECRETS)
SCHEDULER_ATTACHES = ("httpTarget.oidcToken.serviceAccountEmail", "httpTarget.oauthToken.serviceAccountEmail")

FIRESTORE_DOCUMENTS = "https://firestore.googleapis.com/v1/projects/{project}/databases/{database}/documents"
GCS = "https://storage.googleapis.com"
TPU_LOCATION = "https://tpu.googleapis.com/v2/projects/{project}/locations/{location}"


def _tpu(method: str, rest: str) -> str:
    return (f"https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.{rest} (IAM block: {method}); "
            "iam-dataset map.json agrees")


# What the services call at run time, each as its own service account (tpuq_dev.iam.calls checks the stack's
# recording against these). gRPC methods are the same methods as their REST rows: one row, two names.
RUNTIME_METHODS: tuple[Method, ...] = (
    # ---- Pub/Sub: every service publishes (tpuq.runtime.clients.Clients.publish)
    Method("pubsub.projects.topics.publish", "POST",
           "https://pubsub.googleapis.com/v1/projects/{project}/topics/{topic}:publish",
           _p("pubsub.topics.publish"), PUBSUB, grpc="/google.pubsub.v1.Publisher/Publish"),
    # ---- Firestore over gRPC (google-cloud-firestore): reads, queries, transactions; the commit row is above
    Method("firestore.projects.databases.documents.batchGet", "POST", f"{FIRESTORE_DOCUMENTS}:batchGet",
           _p("datastore.entities.get"), FIRESTORE_METHODS, grpc="/google.firestore.v1.Firestore/BatchGetDocuments"),
    Method("firestore.projects.databases.documents.beginTransaction", "POST", f"{FIRESTORE_DOCUMENTS}:beginTransaction",
           _p("datastore.databases.get"), FIRESTORE_METHODS, grpc="/google.firestore.v1.Firestore/BeginTransaction"),
    Method("firestore.projects.databases.documents.rollback", "POST", f"{FIRESTORE_DOCUMENTS}:rollback",
           _p("datastore.databases.get"), FIRESTORE_METHODS, grpc="/google.firestore.v1.Firestore/Rollback"),
    Method("firestore.projects.databases.documents.runQuery", "POST",
           f"{FIRESTORE_DOCUMENTS}/{{parent_collection}}/{{parent_document}}:runQuery",
           _p("datastore.entities.get", "datastore.entities.list"), FIRESTORE_METHODS,
           grpc="/google.firestore.v1.Firestore/RunQuery"),
    # The page's table has no aggregation row: the stricter of the query's two (a count reads no entity).
    Method("firestore.projects.databases.documents.runAggregationQuery", "POST",
           f"{FIRESTORE_DOCUMENTS}/{{parent_collection}}/{{parent_document}}:runAggregationQuery",
           _p("datastore.entities.get", "datastore.entities.list"), f"{FIRESTORE_METHODS} (as runQuery)",
           grpc="/google.firestore.v1.Firestore/RunAggregationQuery"),
    # ---- Cloud Storage, JSON API (google-cloud-storage): the executor's status objects, the scheduler's job files
    # and bundles. Media downloads and uploads have their own URLs (the discovery document's mediaUpload paths and
    # its download service) but are the same methods.
    Method("storage.objects.list", "GET", f"{GCS}/storage/v1/b/{{bucket}}/o", _p("storage.objects.list"), STORAGE),
    Method("storage.objects.get", "GET", f"{GCS}/storage/v1/b/{{bucket}}/o/{{object}}", _p("storage.objects.get"),
           STORAGE),
    Method("storage.objects.get", "GET", f"{GCS}/download/storage/v1/b/{{bucket}}/o/{{object}}",
           _p("storage.objects.get"), STORAGE),
    Method("storage.objects.insert", "POST", f"{GCS}/upload/storage/v1/b/{{bucket}}/o",
           (Need("storage.objects.create"), Need("storage.objects.delete", when="it may replace an object")), STORAGE),
    Method("storage.objects.insert", "POST", f"{GCS}/storage/v1/b/{{bucket}}/o",
           (Need("storage.objects.create"), Need("storage.objects.delete", when="it may replace an object")), STORAGE),
    Method("storage.objects.delete", "DELETE", f"{GCS}/storage/v1/b/{{bucket}}/o/{{object}}",
           _p("storage.objects.delete"), STORAGE),
    Method("storage.objects.patch", "PATCH", f"{GCS}/storage/v1/b/{{bucket}}/o/{{object}}",
           _p("storage.objects.get", "storage.objects.update"), STORAGE),
    Method("storage.objects.compose", "POST", f"{GCS}/storage/v1/b/{{bucket}}/o/{{object}}/compose",
           (Need("storage.objects.get"), Need("storage.objects.create"),
            Need("storage.objects.delete", when="it may replace an object")), STORAGE),
    # A resumable upload (google-cloud-storage's for anything over 8 MiB, and its BlobWriter) sends its data with PUT
    # to the session URI, the insert URL with an upload_id: the same objects.insert, checked as its first request.
    Method("storage.objects.insert", "PUT", f"{GCS}/upload/storage/v1/b/{{bucket}}/o",
           (Need("storage.objects.create"), Need("storage.objects.delete", when="it may replace an object")),
           f"{STORAGE}; https://cloud.google.com/storage/docs/performing-resumable-uploads"),
    # The scheduler's packed folder, copied under its content name into each of the job's buckets: get on the
    # source, create (and delete, when it may replace one) on the destination.
    Method("storage.objects.rewrite", "POST",
           f"{GCS}/storage/v1/b/{{bucket}}/o/{{object}}/rewriteTo/b/{{destination_bucket}}/o/{{destination_object}}",
           (Need("storage.objects.get"), Need("storage.objects.create", On("url:destination_bucket", "bucket")),
            Need("storage.objects.delete", On("url:destination_bucket", "bucket"), when="it may replace an object")),
           STORAGE),
    # ---- Cloud TPU (google-cloud-tpu's REST transport): the claimer, the janitor, the executor's host keys.
    # A queued resource's methods are checked as the node permissions (there are no tpu.queuedResources.*).
    Method("tpu.projects.locations.queuedResources.get", "GET", f"{TPU_LOCATION}/queuedResources/{{queued_resource}}",
           _p("tpu.nodes.get"), _tpu("tpu.nodes.get", "queuedResources/get")),
    Method("tpu.projects.locations.queuedResources.list", "GET", f"{TPU_LOCATION}/queuedResources",
           _p("tpu.nodes.list"), _tpu("tpu.nodes.list", "queuedResources/list")),
    Method("tpu.projects.locations.queuedResources.delete", "DELETE",
           f"{TPU_LOCATION}/queuedResources/{{queued_resource}}",
           _p("tpu.nodes.delete"), _tpu("tpu.nodes.delete", "queuedResources/delete")),
    Method("tpu.projects.locations.nodes.get", "GET", f"{TPU_LOCATION}/nodes/{{node}}",
           _p("tpu.nodes.get"), _tpu("tpu.nodes.get", "nodes/get")),
    Method("tpu.projects.locations.nodes.list", "GET", f"{TPU_LOCATION}/nodes",
           _p("tpu.nodes.list"), _tpu("tpu.nodes.list", "nodes/list")),
    Method("tpu.projects.locations.nodes.delete", "DELETE", f"{TPU_LOCATION}/nodes/{{node}}",
           _p("tpu.nodes.delete"), _tpu("tpu.nodes.delete", "nodes/delete")),
    Method("tpu.projects.locations.nodes.getGuestAttributes", "POST",
           f"{TPU_LOCATION}/nodes/{{node}}:getGuestAttributes",
           _p("tpu.nodes.get"), _tpu("tpu.nodes.get", "nodes/getGuestAttributes")),
    Method("tpu.projects.locations.operations.get", "GET", f"{TPU_LOCATION}/operations/{{operation}}",
           _p("tpu.operations.get"), _tpu("tpu.operations.get", "operations/get")),
    # ---- Cloud Quotas: the claimer's and the dashboard's quota read (tpuq.capacity.cloudchecks); no discovery document
    # ships for it, so its row is checked against the REST reference by hand.
    Method("cloudquotas.projects.locations.services.quotaInfos.get", "GET",
           "https://cloudquotas.googleapis.com/v1/projects/{project}/locations/{location}/services/{service}/"
           "quotaInfos/{quota_info}", _p("cloudquotas.quotas.get"),
           "https://cloud.google.com/docs/quotas/reference/rest/v1/projects.locations.services.quotaInfos/get (IAM "
           "block: cloudquotas.quotas.get)"),
)

METHODS: tuple[Method, ...] = (
    # ---- Service Usage
    Method("serviceusage.services.list", "GET", "https://serviceusage.googleapis.com/v1/projects/{project}/services",
           _p("serviceusage.services.list"), SERVICE_USAGE),
    # The table also names servicemanagement.services.bind "on the service": that is the producer's policy on a
    # public Google API, which every consumer holds; not modelled.
    Method("serviceusage.services.enable", "POST",
           "https://serviceusage.googleapis.com/v1/projects/{project}/services/{api}:enable",
           _p("serviceusage.services.enable"), SERVICE_USAGE),
    Method("serviceusage.services.generateServiceIdentity", "POST",
           "https://serviceusage.googleapis.com/v1beta1/projects/{project}/services/{api}:generateServiceIdentity",
           (), "https://cloud.google.com/service-usage/docs/reference/rest/v1beta1/services/generateServiceIdentity "
               "(OAuth scopes only, no IAM permission; firebase-tools#11005: it checks no consumer project "
               "permission)"),
    # ---- Resource Manager
    Method("cloudresourcemanager.projects.get", "GET", "https://cloudresourcemanager.googleapis.com/v1/projects/{project}",
           _p("resourcemanager.projects.get"), CRM),
    Method("cloudresourcemanager.projects.getIamPolicy", "POST",
           "https://cloudresourcemanager.googleapis.com/v1/projects/{project}:getIamPolicy",
           _p("resourcemanager.projects.getIamPolicy"), CRM),
    Method("cloudresourcemanager.projects.setIamPolicy", "POST",
           "https://cloudresourcemanager.googleapis.com/v1/projects/{project}:setIamPolicy",
           _p("resourcemanager.projects.setIamPolicy"), CRM, effect="grant"),
    Method("cloudresourcemanager.projects.getEffectiveOrgPolicy", "POST",
           "https://cloudresourcemanager.googleapis.com/v1/projects/{project}:getEffectiveOrgPolicy",
           _p("orgpolicy.policy.get"),
           "https://cloud.google.com/resource-manager/reference/rest/v1/projects/getEffectiveOrgPolicy",
           advisory=NETWORK_ADVISORY),
    # ---- IAM: service accounts and their policies
    Method("iam.projects.serviceAccounts.list", "GET", "https://iam.googleapis.com/v1/projects/{project}/serviceAccounts",
           _p("iam.serviceAccounts.list"), IAM_SA),
    Method("iam.projects.serviceAccounts.create", "POST", "https://iam.googleapis.com/v1/projects/{project}/serviceAccounts",
           _p("iam.serviceAccounts.create"), IAM_SA),
    Method("iam.projects.serviceAccounts.getIamPolicy", "POST",
           "https://iam.googleapis.com/v1/projects/{project}/serviceAccounts/{service_account}:getIamPolicy",
           _p("iam.serviceAccounts.getIamPolicy"), IAM_SA),
    Method("iam.projects.serviceAccounts.setIamPolicy", "POST",
           "https://iam.googleapis.com/v1/projects/{project}/serviceAccounts/{service_account}:setIamPolicy",
           _p("iam.serviceAccounts.setIamPolicy"), IAM_SA, effect="grant"),
    # ---- Pub/Sub
    Method("pubsub.projects.topics.list", "GET", "https://pubsub.googleapis.com/v1/projects/{project}/topics",
           _p("pubsub.topics.list"), PUBSUB),
    Method("pubsub.projects.topics.create", "PUT", "https://pubsub.googleapis.com/v1/projects/{project}/topics/{topic}",
           _p("pubsub.topics.create", on=PROJECT), PUBSUB),
    Method("pubsub.projects.topics.getIamPolicy", "GET",
           "https://pubsub.googleapis.com/v1/projects/{project}/topics/{topic}:getIamPolicy",
           _p("pubsub.topics.getIamPolicy"), PUBSUB),
    Method("pubsub.projects.topics.setIamPolicy", "POST",
           "https://pubsub.googleapis.com/v1/projects/{project}/topics/{topic}:setIamPolicy",
           _p("pubsub.topics.setIamPolicy"), PUBSUB, effect="grant"),
    Method("pubsub.projects.subscriptions.list", "GET", "https://pubsub.googleapis.com/v1/projects/{project}/subscriptions",
           _p("pubsub.subscriptions.list"), PUBSUB),
    Method("pubsub.projects.subscriptions.create", "PUT",
           "https://pubsub.googleapis.com/v1/projects/{project}/subscriptions/{subscription}",
           (Need("pubsub.subscriptions.create", PROJECT), Need("pubsub.topics.attachSubscription", On("topic", "topic"))),
           f"{PUBSUB}; {PUSH_AUTH}", acts_as=("pushConfig.oidcToken.serviceAccountEmail",)),
    Method("pubsub.projects.subscriptions.patch", "PATCH",
           "https://pubsub.googleapis.com/v1/projects/{project}/subscriptions/{subscription}",
           _p("pubsub.subscriptions.update", on=PROJECT), f"{PUBSUB}; {PUSH_AUTH}",
           acts_as=("subscription.pushConfig.oidcToken.serviceAccountEmail",)),
    # deploy's move of its own subscription to another topic (a subscription cannot change topic: deleted, created)
    Method("pubsub.projects.subscriptions.delete", "DELETE",
           "https://pubsub.googleapis.com/v1/projects/{project}/subscriptions/{subscription}",
           _p("pubsub.subscriptions.delete", on=PROJECT), PUBSUB),
    # deploy's grant on the hold subscription (infra/iam.yaml: the dashboard reads it)
    Method("pubsub.projects.subscriptions.getIamPolicy", "GET",
           "https://pubsub.googleapis.com/v1/projects/{project}/subscriptions/{subscription}:getIamPolicy",
           _p("pubsub.subscriptions.getIamPolicy"), PUBSUB),
    Method("pubsub.projects.subscriptions.setIamPolicy", "POST",
           "https://pubsub.googleapis.com/v1/projects/{project}/subscriptions/{subscription}:setIamPolicy",
           _p("pubsub.subscriptions.setIamPolicy"), PUBSUB, effect="grant"),
    # People's read of what Pub/Sub dead-lettered (tpuq.operations.heldletters: `tpuq dead-letters`, `tpuq status`, the
    # dashboard): a pull, then modifyAckDeadline 0 to hand every message back. Both are "consume" (the access-control
    # table; iam-dataset map.json: pull, modifyAckDeadline, acknowledge and seek -> pubsub.subscriptions.consume).
    Method("pubsub.projects.subscriptions.pull", "POST",
           "https://pubsub.googleapis.com/v1/projects/{project}/subscriptions/{subscription}:pull",
           _p("pubsub.subscriptions.consume"), PUBSUB, grpc="/google.pubsub.v1.Subscriber/Pull"),
    Method("pubsub.projects.subscriptions.modifyAckDeadline", "POST",
           "https://pubsub.googleapis.com/v1/projects/{project}/subscriptions/{subscription}:modifyAckDeadline",
           _p("pubsub.subscriptions.consume"), PUBSUB, grpc="/google.pubsub.v1.Subscriber/ModifyAckDeadline"),
    # ---- Cloud Storage
    # The iam-json table as stored did not show this row; the project read is what every caller of it holds.
    Method("storage.projects.serviceAccount.get", "GET",
           "https://storage.googleapis.com/storage/v1/projects/{project}/serviceAccount",
           _p("resourcemanager.projects.get"), f"{STORAGE} (assumed: no row seen)"),
    # storage.buckets.getIamPolicy only with projection=full, which deploy never asks for.
    Method("storage.buckets.get", "GET", "https://storage.googleapis.com/storage/v1/b/{bucket}",
           _p("storage.buckets.get"), STORAGE),
    Method("storage.buckets.insert", "POST", "https://storage.googleapis.com/storage/v1/b",
           _p("storage.buckets.create"), STORAGE, effect="create_bucket"),
    Method("storage.buckets.patch", "PATCH", "https://storage.googleapis.com/storage/v1/b/{bucket}",
           _p("storage.buckets.update"), STORAGE),
    Method("storage.buckets.getIamPolicy", "GET", "https://storage.googleapis.com/storage/v1/b/{bucket}/iam",
           _p("storage.buckets.getIamPolicy"), STORAGE),
    Method("storage.buckets.setIamPolicy", "PUT", "https://storage.googleapis.com/storage/v1/b/{bucket}/iam",
           _p("storage.buckets.setIamPolicy"), STORAGE, effect="grant"),
    Method("storage.notifications.list", "GET",
           "https://storage.googleapis.com/storage/v1/b/{bucket}/notificationConfigs", _p("storage.buckets.get"), STORAGE),
    # The configurer updates bucket metadata and views the topic; the Cloud Storage agent publishes to it.
    Method("storage.notifications.insert", "POST",
           "https://storage.googleapis.com/storage/v1/b/{bucket}/notificationConfigs",
           (Need("storage.buckets.update"), Need("pubsub.topics.get", On("topic", "topic"))), f"{STORAGE}; {NOTIFY}",
           identity_needs=(IdentityNeed("agent:storage", "pubsub.topics.publish", "topic", "topic", NOTIFY),)),
    # ---- Artifact Registry
    Method("artifactregistry.projects.locations.repositories.list", "GET",
           "https://artifactregistry.googleapis.com/v1/projects/{project}/locations/{location}/repositories",
           _p("artifactregistry.repositories.list"), ARTIFACT),
    Method("artifactregistry.projects.locations.repositories.create", "POST",
           "https://artifactregistry.googleapis.com/v1/projects/{project}/locations/{location}/repositories",
           _p("artifactregistry.repositories.create"), ARTIFACT),
    # ---- Cloud Run
    Method("run.projects.locations.services.list", "GET",
           "https://run.googleapis.com/v2/projects/{project}/locations/{location}/services", _p("run.services.list"), RUN),
    Method("run.projects.locations.services.create", "POST",
           "https://run.googleapis.com/v2/projects/{project}/locations/{location}/services",
           _p("run.services.create"), f"{RUN}; {RUN_IDENTITY}", acts_as=RUN_ATTACHES, identity_needs=(RUN_SECRET_ACCESS,)),
    Method("run.projects.locations.services.patch", "PATCH",
           "https://run.googleapis.com/v2/projects/{project}/locations/{location}/services/{run_service}",
           _p("run.services.update"), f"{RUN}; {RUN_IDENTITY}", acts_as=RUN_ATTACHES,
           identity_needs=(RUN_SECRET_ACCESS,)),
    Method("run.projects.locations.services.getIamPolicy", "GET",
           "https://run.googleapis.com/v2/projects/{project}/locations/{location}/services/{run_service}:getIamPolicy",
           _p("run.services.getIamPolicy"), RUN),
    Method("run.projects.locations.services.setIamPolicy", "POST",
           "https://run.googleapis.com/v2/projects/{project}/locations/{location}/services/{run_service}:setIamPolicy",
           _p("run.services.setIamPolicy"), RUN, effect="grant"),
    # ---- Cloud Scheduler
    Method("cloudscheduler.projects.locations.jobs.list", "GET",
           "https://cloudscheduler.googleapis.com/v1/projects/{project}/locations/{location}/jobs",
           _p("cloudscheduler.jobs.list"), SCHEDULER),
    Method("cloudscheduler.projects.locations.jobs.create", "POST",
           "https://cloudscheduler.googleapis.com/v1/projects/{project}/locations/{location}/jobs",
           _p("cloudscheduler.jobs.create"), SCHEDULER, acts_as=SCHEDULER_ATTACHES),
    Method("cloudscheduler.projects.locations.jobs.patch", "PATCH",
           "https://cloudscheduler.googleapis.com/v1/projects/{project}/locations/{location}/jobs/{job}",
           _p("cloudscheduler.jobs.update"), SCHEDULER, acts_as=SCHEDULER_ATTACHES),
    # ---- Firestore
    Method("firestore.projects.databases.get", "GET",
           "https://firestore.googleapis.com/v1/projects/{project}/databases/{database}",
           _p("datastore.databases.getMetadata"), FIRESTORE),
    Method("firestore.projects.databases.create", "POST", "https://firestore.googleapis.com/v1/projects/{project}/databases",
           _p("datastore.databases.create"), FIRESTORE),
    Method("firestore.projects.databases.collectionGroups.indexes.list", "GET",
           "https://firestore.googleapis.com/v1/projects/{project}/databases/{database}/collectionGroups/{group}/indexes",
           _p("datastore.schemas.list"), FIRESTORE),
    Method("firestore.projects.databases.collectionGroups.indexes.create", "POST",
           "https://firestore.googleapis.com/v1/projects/{project}/databases/{database}/collectionGroups/{group}/indexes",
           _p("datastore.schemas.create"), FIRESTORE),
    # The fleet document (save_fleet's set(): an update with no precondition, so create and update), and every
    # write the services make (the same method over gRPC).
    Method("firestore.projects.databases.documents.commit", "POST",
           "https://firestore.googleapis.com/v1/projects/{project}/databases/{database}/documents:commit",
           FIRESTORE_WRITE_NEEDS, FIRESTORE_METHODS, grpc="/google.firestore.v1.Firestore/Commit"),
    # ---- Secret Manager: grants; and the one secret deploy makes itself, the dashboard's session key (random
    # bytes made when applied: tpuq.deploy.generated_secrets). tpuq never reads a secret's value.
    Method("secretmanager.projects.secrets.list", "GET", "https://secretmanager.googleapis.com/v1/projects/{project}/secrets",
           _p("secretmanager.secrets.list"), SECRETS),
    Method("secretmanager.projects.secrets.create", "POST",
           "https://secretmanager.googleapis.com/v1/projects/{project}/secrets",
           _p("secretmanager.secrets.create", on=PROJECT), SECRET_WRITES),
    Method("secretmanager.projects.secrets.addVersion", "POST",
           "https://secretmanager.googleapis.com/v1/projects/{project}/secrets/{secret}:addVersion",
           _p("secretmanager.versions.add"), SECRET_WRITES),
    Method("secretmanager.projects.secrets.versions.list", "GET",
           "https://secretmanager.googleapis.com/v1/projects/{project}/secrets/{secret}/versions",
           _p("secretmanager.versions.list"), SECRET_WRITES),
    # The janitor reads a notification destination's webhook URL (tpuq.janitor.notify, tpuq.runtime.secretmanager).
    Method("secretmanager.projects.secrets.versions.access", "GET",
           "https://secretmanager.googleapis.com/v1/projects/{project}/secrets/{secret}/versions/{version}:access",
           _p("secretmanager.versions.access"), SECRET_ACCESS),
    Method("secretmanager.projects.secrets.getIamPolicy", "GET",
           "https://secretmanager.googleapis.com/v1/projects/{project}/secrets/{secret}:getIamPolicy",
           _p("secretmanager.secrets.getIamPolicy"), SECRETS),
    Method("secretmanager.projects.secrets.setIamPolicy", "POST",
           "https://secretmanager.googleapis.com/v1/projects/{project}/secrets/{secret}:setIamPolicy",
           _p("secretmanager.secrets.setIamPolicy"), SECRETS, effect="grant"),
    # ---- Compute Engine, read only (tpuq.deploy.network)
    Method("compute.projects.get", "GET", "https://compute.googleapis.com/compute/v1/projects/{project}",
           _p("compute.projects.get"), COMPUTE, advisory=NETWORK_ADVISORY),
    Method("compute.firewalls.list", "GET", "https://compute.googleapis.com/compute/v1/projects/{project}/global/firewalls",
           _p("compute.firewalls.list"), COMPUTE, advisory=NETWORK_ADVISORY),
    Method("compute.subnetworks.get", "GET",
           "https://compute.googleapis.com/compute/v1/projects/{project}/regions/{region}/subnetworks/{subnetwork}",
           _p("compute.subnetworks.get"), COMPUTE, advisory=NETWORK_ADVISORY),
    Method("compute.routers.list", "GET",
           "https://compute.googleapis.com/compute/v1/projects/{project}/regions/{region}/routers",
           _p("compute.routers.list"), COMPUTE, advisory=NETWORK_ADVISORY),
    # ---- Cloud Build and Cloud Billing, read only
    Method("cloudbuild.projects.locations.getDefaultServiceAccount", "GET",
           "https://cloudbuild.googleapis.com/v1/projects/{project}/locations/{location}/defaultServiceAccount",
           _p("cloudbuild.builds.get"),
           "https://cloud.google.com/build/docs/api/reference/rest/v1/projects.locations/getDefaultServiceAccount",
           advisory="tolerant read: refused, deploy leaves out the line naming Cloud Build's default account"),
    Method("cloudbilling.projects.getBillingInfo", "GET", "https://cloudbilling.googleapis.com/v1/projects/{project}/billingInfo",
           _p("resourcemanager.projects.get"),
           "cloudbilling v1 discovery, projects.getBillingInfo: \"must have the resourcemanager.projects.get permission\"",
           advisory="tolerant read: refused, billing reads as unknown, which blocks nothing"),
    # ---- Cloud TPU: the claimer's create (tpuq.claimer.tpuapi.build_queued_resource)
    Method("tpu.projects.locations.queuedResources.create", "POST",
           "https://tpu.googleapis.com/v2/projects/{project}/locations/{location}/queuedResources",
           _p("tpu.nodes.create"),
           "https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/create (IAM "
           "block: tpu.nodes.create); production-facts.md, actAs: a TPU node with serviceAccount.email",
           acts_as=("tpu.nodeSpec[].node.serviceAccount.email",)),
    *RUNTIME_METHODS,
)


@dataclass(frozen=True)
class Match:
    method: Method
    variables: dict = field(hash=False)


def find(http_method: str, url: str) -> Match | None:
    """The row for this verb and URL (query left off), or None: a method the model does not know."""
    bare = url.split("?", 1)[0]
    for method in METHODS:
        if method.http_method == http_method:
            m = method.pattern.fullmatch(bare)
            if m:
                return Match(method, m.groupdict())
    return None


def find_grpc(full_method: str, resource_name: str) -> Match | None:
    """The row whose gRPC name this is, with the URL variables a resource name gives it: `projects/p/topics/t`
    gives {project: p, topic: t} to a row whose URL has `projects/{project}` and `topics/{topic}`."""
    method = _grpc_rows().get(full_method)
    if method is None:
        return None
    segments = resource_name.split("/")
    variables = {}
    for m in re.finditer(r"([A-Za-z]+)/\{([a-z_]+)\}", method.url):
        if m.group(1) in segments[:-1]:
            variables[m.group(2)] = segments[segments.index(m.group(1)) + 1]
    return Match(method, variables)


@cache
def _grpc_rows() -> dict[str, Method]:
    return {method.grpc: method for method in METHODS if method.grpc}


def applies(need: Need, query: Any, body: Any) -> bool:
    return not need.when or CONDITIONS[need.when](query, body)


def modelled_permissions() -> frozenset[str]:
    """Every permission some row checks: what the role table must say, for each role, whether it holds."""
    out = {n.permission for m in METHODS for n in m.needs}
    out |= {i.permission for m in METHODS for i in m.identity_needs}
    if any(m.acts_as for m in METHODS):
        out.add(ACT_AS)
    return frozenset(out)
