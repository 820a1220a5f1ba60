"""Stand-ins for the Google APIs that have no local emulator: they record what deploy sends."""

from __future__ import annotations

from tpuq.deploy.gcp import ApiError
from tpuq.deploy.plan import Action, ProjectState, Request
from tpuq.contracts.fleet import FleetFile


class RecordingApi:
    """Reads find nothing (404, as in an empty project); writes are recorded and succeed."""

    def __init__(self, name: str):
        self.name = name
        self.sent: list[Request] = []

    def call(self, method, path, params=None, body=None):
        if method == "GET" or path.endswith((":getIamPolicy", ":getEffectiveOrgPolicy")):  # reads, though POSTs
            raise ApiError(self.name, method, path, 404, "not found (recording stand-in)")
        self.sent.append(Request(self.name, method, path, params, body))
        return {}

    def get_or_none(self, path, params=None):
        return None

    def list_all(self, path, key, params=None):
        raise ApiError(self.name, "GET", path, 404, "not found (recording stand-in)")

    def send(self, request: Request):
        if request.method == "GET" or request.path.endswith(":getIamPolicy"):
            return {}
        self.sent.append(request)
        return {}


class SecretsHeld(RecordingApi):
    """Secret Manager in a project that holds these secrets (names only: tpuq never reads a value)."""

    def __init__(self, *names: str):
        super().__init__("secretmanager")
        self.names = names

    def list_all(self, path, key, params=None):
        return [{"name": f"{path}/{name}"} for name in self.names]


class ProjectApi(RecordingApi):
    """Cloud Resource Manager: knows the project number; records policy writes."""

    def __init__(self, number: str = "123456789"):
        super().__init__("crm")
        self.number = number

    def call(self, method, path, params=None, body=None):
        if method == "GET" and path.startswith("projects/") and ":" not in path:
            return {"projectNumber": self.number}
        return super().call(method, path, params, body)


class EmulatorWithoutIam:
    """The Pub/Sub emulator implements no IAM: policy calls go to a recorder, everything else to the emulator."""

    def __init__(self, emulator):
        self.emulator = emulator
        self.iam = RecordingApi(emulator.name)

    def _for(self, path: str):
        return self.iam if path.endswith((":getIamPolicy", ":setIamPolicy")) else self.emulator

    def call(self, method, path, params=None, body=None):
        return self._for(path).call(method, path, params, body)

    def get_or_none(self, path, params=None):
        return self._for(path).get_or_none(path, params)

    def list_all(self, path, key, params=None):
        return self._for(path).list_all(path, key, params)

    def send(self, request):
        return self._for(request.path).send(request)


class FirestoreAdminStandIn(RecordingApi):
    """The Firestore admin API, for a project whose (default) database exists (the emulator's)."""

    def __init__(self):
        super().__init__("firestore")

    def get_or_none(self, path, params=None):
        return {"name": path} if path.endswith("/databases/(default)") else None


def state_after(actions: list[Action], project_number: str = "42",
                secrets: tuple[str, ...] = ("tpuq-ssh", "tpuq-ssh-public"), start: ProjectState | None = None) -> ProjectState:
    """The project as Google would hold it once these actions were applied (to `start`, else to an empty one)."""
    s = start or ProjectState(known=True, project_number=project_number, secrets=set(secrets))
    for a in actions:
        r = a.request
        if a.iam is not None:
            s.iam.setdefault(a.iam.key, set()).add((a.role, a.member))
        elif r is None:
            continue
        elif r.api == "serviceusage":
            s.enabled_apis.add(r.path.split("/")[-1].removesuffix(":enable"))
        elif r.method == "GET" or r.api == "serviceusage_v1beta1":
            continue  # a service agent made to exist: nothing deploy reads back
        elif r.api == "iam":
            email = f"{r.body['accountId']}@{r.path.split('/')[1]}.iam.gserviceaccount.com"
            s.service_accounts.add(email)
            s.service_account_resources[email] = {"email": email, **r.body["serviceAccount"]}
        elif r.api == "pubsub" and "/topics/" in r.path:
            s.topics.add(r.path.rsplit("/", 1)[-1])
            s.topic_resources[r.path.rsplit("/", 1)[-1]] = {"name": r.path, **r.body}
        elif r.api == "pubsub" and r.method == "PATCH":  # an update: only the fields its mask names change
            current = s.subscriptions.setdefault(r.path.rsplit("/", 1)[-1], {})
            current.update({k: r.body["subscription"][k] for k in r.body["updateMask"].split(",")})
        elif r.api == "pubsub":
            s.subscriptions[r.path.rsplit("/", 1)[-1]] = r.body
        elif r.api == "storage" and r.path == "b":
            s.buckets[r.body["name"]] = r.body
        elif r.api == "storage":
            configs = s.notifications.setdefault(r.path.split("/")[1], [])
            configs.append({"id": str(len(configs) + 1), **r.body})
        elif r.api == "artifactregistry":
            s.artifact_repositories.add(r.params["repositoryId"])
            s.artifact_repository_resources[r.params["repositoryId"]] = r.body
        elif r.api == "run":
            s.run_services[r.params["serviceId"]] = r.body
        elif r.api == "scheduler":
            s.scheduler_jobs[r.body["name"].rsplit("/", 1)[-1]] = r.body
        elif r.api == "firestore" and r.params:
            s.firestore_databases.add(r.params["databaseId"])
        elif r.api == "firestore":
            name = f"{r.path}/index-{len(s.firestore_indexes)}"
            s.firestore_indexes.append({"name": name, "collectionGroup": r.path.split("/")[-2], **r.body})
        elif r.api == "fleetstore":
            s.stored_fleet_version = FleetFile.model_validate(r.body).version
        elif r.api == "secretmanager" and r.path.endswith(":addVersion"):  # a secret deploy makes: its value
            s.versionless_secrets.discard(r.path.split("/")[3].removesuffix(":addVersion"))
        elif r.api == "secretmanager":  # ... and the secret itself
            s.secrets = (s.secrets or set()) | {r.params["secretId"]}
    return s
