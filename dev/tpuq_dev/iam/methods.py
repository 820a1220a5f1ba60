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
from dataclasses import dataclass, field
from functools import cached_property

PERMISSIONS_REFERENCE = "https://cloud.google.com/iam/docs/permissions-reference"
ACT_AS = "iam.serviceAccounts.actAs"

# URL template variables that name a resource IAM policies can be set on; any other variable ({project},
# {location}, {api}, ...) names no such resource, and a permission checked there is checked on the project.
RESOURCE_VARIABLES = {"topic": "topic", "bucket": "bucket", "secret": "secret", "service_account": "service_account",
                      "run_service": "run_service"}


@dataclass(frozen=True)
class On:
    """Where a permission is checked: `resource` (the URL's), `project`, or a resource of `kind` named at a body path."""

    where: str = "resource"
    kind: str = ""


PROJECT = On("project")


@dataclass(frozen=True)
class Need:
    permission: str
    on: On = On()


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
COMPUTE = "https://cloud.google.com/compute/docs/reference/rest/v1 (each method's IAM block)"
NETWORK_ADVISORY = "tolerant read: refused, deploy prints the network/OS Login check as 'could not be checked'"

RUN_ATTACHES = ("template.serviceAccount",)
RUN_SECRET_ACCESS = IdentityNeed("template.serviceAccount", "secretmanager.versions.access", "secret",
                                 "template.volumes[].secret.secret", RUN_SECRETS)
SCHEDULER_ATTACHES = ("httpTarget.oidcToken.serviceAccountEmail", "httpTarget.oauthToken.serviceAccountEmail")

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
    # The fleet document: save_fleet's set() is a commit of an update with no precondition.
    Method("firestore.projects.databases.documents.commit", "POST",
           "https://firestore.googleapis.com/v1/projects/{project}/databases/{database}/documents:commit",
           _p("datastore.entities.create", "datastore.entities.update"), FIRESTORE),
    # ---- Secret Manager (grants only: tpuq never reads or writes a secret's value)
    Method("secretmanager.projects.secrets.list", "GET", "https://secretmanager.googleapis.com/v1/projects/{project}/secrets",
           _p("secretmanager.secrets.list"), SECRETS),
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


def modelled_permissions() -> frozenset[str]:
    """Every permission some row checks: what the role table must say, for each role, whether it holds."""
    out = {n.permission for m in METHODS for n in m.needs}
    out |= {i.permission for m in METHODS for i in m.identity_needs}
    if any(m.acts_as for m in METHODS):
        out.add(ACT_AS)
    return frozenset(out)
