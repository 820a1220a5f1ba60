"""Core (pure): for each predefined role tpuq grants, the permissions it holds that the method table checks.

Only the modelled permissions are listed (`methods.modelled_permissions()`), not the whole role: a role missing a
permission here means "not among what the modelled requests need", so a new method row whose permission no role
lists is refused until someone looks the role up and adds it with its source. Each role's page is
https://cloud.google.com/iam/docs/understanding-roles#<role> (`source(role)`); the lists were read from
`gcloud iam roles describe` output as github.com/iann0036/iam-dataset stores it (gcp/roles/<role>.json, commit
2073fa52, 2026-08-22).

roles/owner holds every modelled permission but the Cloud Storage bucket and object ones (`OWNER_LACKS`, same
source): a project owner reaches a bucket through the bucket's own policy, whose default binds roles/storage.legacyBucketOwner
to the convenience member projectOwner:PROJECT (https://cloud.google.com/storage/docs/access-control/iam#convenience-values;
`BUCKET_DEFAULT_BINDINGS`). A bucket made with another policy, or in another project, is out of an owner's reach
unless granted: the model assumes the fleet's job buckets are in the project with the default policy.
"""

from __future__ import annotations

OWNER = "roles/owner"
EDITOR = "roles/editor"
VIEWER = "roles/viewer"

OWNER_LACKS = frozenset({"storage.buckets.get", "storage.buckets.getIamPolicy", "storage.buckets.setIamPolicy",
                         "storage.buckets.update", "storage.objects.create", "storage.objects.delete",
                         "storage.objects.get", "storage.objects.list", "storage.objects.update"})

# A new bucket's policy (uniform access): the convenience members and the legacy roles they get.
BUCKET_DEFAULT_BINDINGS = (("roles/storage.legacyBucketOwner", "projectOwner"),
                           ("roles/storage.legacyBucketOwner", "projectEditor"),
                           ("roles/storage.legacyBucketReader", "projectViewer"))
CONVENIENCE_MEMBER = {OWNER: "projectOwner", EDITOR: "projectEditor", VIEWER: "projectViewer"}

# role -> (title, the modelled permissions it holds). An empty tuple: it holds none of them (its permissions
# matter to the services at run time, which the model does not check yet).
ROLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "roles/artifactregistry.admin": ("Artifact Registry Administrator", (
        "artifactregistry.repositories.create", "artifactregistry.repositories.list", "resourcemanager.projects.get")),
    "roles/browser": ("Browser", ("resourcemanager.projects.get", "resourcemanager.projects.getIamPolicy")),
    "roles/cloudquotas.viewer": ("Cloud Quotas Viewer", ("cloudquotas.quotas.get", "resourcemanager.projects.get")),
    "roles/cloudscheduler.admin": ("Cloud Scheduler Admin", (
        "cloudscheduler.jobs.create", "cloudscheduler.jobs.list", "cloudscheduler.jobs.update",
        "resourcemanager.projects.get", "serviceusage.services.list")),
    "roles/compute.networkViewer": ("Compute Network Viewer", (
        "compute.firewalls.list", "compute.projects.get", "compute.routers.list", "compute.subnetworks.get",
        "resourcemanager.projects.get", "serviceusage.services.list")),
    "roles/datastore.owner": ("Cloud Datastore Owner", (
        "datastore.databases.create", "datastore.databases.get", "datastore.databases.getMetadata",
        "datastore.entities.create", "datastore.entities.delete", "datastore.entities.get", "datastore.entities.list",
        "datastore.entities.update", "datastore.schemas.create", "datastore.schemas.list",
        "resourcemanager.projects.get")),
    "roles/datastore.user": ("Cloud Datastore User", (
        "datastore.databases.get", "datastore.databases.getMetadata", "datastore.entities.create",
        "datastore.entities.delete", "datastore.entities.get", "datastore.entities.list", "datastore.entities.update",
        "datastore.schemas.list", "resourcemanager.projects.get")),
    "roles/iam.serviceAccountAdmin": ("Service Account Admin", (
        "iam.serviceAccounts.create", "iam.serviceAccounts.getIamPolicy", "iam.serviceAccounts.list",
        "iam.serviceAccounts.setIamPolicy", "resourcemanager.projects.get")),
    "roles/iam.serviceAccountTokenCreator": ("Service Account Token Creator", (
        "iam.serviceAccounts.list", "resourcemanager.projects.get")),
    "roles/iam.serviceAccountUser": ("Service Account User", (
        "iam.serviceAccounts.actAs", "iam.serviceAccounts.list", "resourcemanager.projects.get")),
    "roles/logging.logWriter": ("Logs Writer", ()),
    "roles/orgpolicy.policyViewer": ("Organization Policy Viewer", ("orgpolicy.policy.get",)),
    "roles/pubsub.admin": ("Pub/Sub Admin", (
        "pubsub.subscriptions.consume", "pubsub.subscriptions.create", "pubsub.subscriptions.delete",
        "pubsub.subscriptions.getIamPolicy",
        "pubsub.subscriptions.list", "pubsub.subscriptions.setIamPolicy", "pubsub.subscriptions.update",
        "pubsub.topics.attachSubscription", "pubsub.topics.create", "pubsub.topics.get", "pubsub.topics.getIamPolicy",
        "pubsub.topics.list", "pubsub.topics.publish", "pubsub.topics.setIamPolicy", "resourcemanager.projects.get",
        "serviceusage.services.list")),
    "roles/pubsub.publisher": ("Pub/Sub Publisher", ("pubsub.topics.publish",)),
    "roles/pubsub.subscriber": ("Pub/Sub Subscriber", (
        "pubsub.subscriptions.consume", "pubsub.topics.attachSubscription")),
    "roles/resourcemanager.projectIamAdmin": ("Project IAM Admin", (
        "resourcemanager.projects.get", "resourcemanager.projects.getIamPolicy", "resourcemanager.projects.setIamPolicy")),
    "roles/run.admin": ("Cloud Run Admin", (
        "resourcemanager.projects.get", "run.services.create", "run.services.getIamPolicy", "run.services.list",
        "run.services.setIamPolicy", "run.services.update")),
    "roles/run.invoker": ("Cloud Run Invoker", ()),
    "roles/secretmanager.admin": ("Secret Manager Admin", (
        "resourcemanager.projects.get", "secretmanager.secrets.create", "secretmanager.secrets.getIamPolicy",
        "secretmanager.secrets.list", "secretmanager.secrets.setIamPolicy", "secretmanager.versions.access",
        "secretmanager.versions.add", "secretmanager.versions.list")),
    "roles/secretmanager.secretAccessor": ("Secret Manager Secret Accessor", (
        "resourcemanager.projects.get", "secretmanager.versions.access")),
    "roles/serviceusage.serviceUsageAdmin": ("Service Usage Admin", (
        "serviceusage.services.enable", "serviceusage.services.list")),
    "roles/storage.admin": ("Storage Admin", (
        "orgpolicy.policy.get", "resourcemanager.projects.get", "storage.buckets.create", "storage.buckets.get",
        "storage.buckets.getIamPolicy", "storage.buckets.setIamPolicy", "storage.buckets.update",
        "storage.objects.create", "storage.objects.delete", "storage.objects.get", "storage.objects.list",
        "storage.objects.update")),
    "roles/storage.objectAdmin": ("Storage Object Admin", (
        "orgpolicy.policy.get", "resourcemanager.projects.get", "storage.objects.create", "storage.objects.delete",
        "storage.objects.get", "storage.objects.list", "storage.objects.update")),
    "roles/storage.objectViewer": ("Storage Object Viewer", (
        "resourcemanager.projects.get", "storage.objects.get", "storage.objects.list")),
    "roles/tpu.admin": ("TPU Admin", (
        "resourcemanager.projects.get", "tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get", "tpu.nodes.list",
        "tpu.operations.get")),
    "roles/tpu.viewer": ("TPU Viewer", (
        "resourcemanager.projects.get", "tpu.nodes.get", "tpu.nodes.list", "tpu.operations.get")),
    # Not granted by tpuq: a new bucket's default policy gives them to the convenience members.
    "roles/storage.legacyBucketOwner": ("Storage Legacy Bucket Owner", (
        "storage.buckets.get", "storage.buckets.getIamPolicy", "storage.buckets.setIamPolicy",
        "storage.buckets.update", "storage.objects.create", "storage.objects.delete", "storage.objects.list")),
    "roles/storage.legacyBucketReader": ("Storage Legacy Bucket Reader", (
        "storage.buckets.get", "storage.objects.list")),
}


class UnknownRole(KeyError):
    """A role the table has no row for: the model cannot say what it holds, so nothing is assumed."""


def source(role: str) -> str:
    return f"https://cloud.google.com/iam/docs/understanding-roles#{role.removeprefix('roles/')}"


def holds(role: str, permission: str) -> bool:
    if role == OWNER:
        return permission not in OWNER_LACKS
    if role not in ROLES:
        raise UnknownRole(f"{role}: no row in dev/tpuq_dev/iam/roles.py; add the permissions it holds, from "
                          f"{source(role)}")
    return permission in ROLES[role][1]
