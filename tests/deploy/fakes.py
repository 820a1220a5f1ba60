"""Stand-ins for the Google APIs that have no local emulator: they record what deploy sends."""

from __future__ import annotations

from tpuq.deploy.gcp import ApiError
from tpuq.deploy.plan import Request


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
