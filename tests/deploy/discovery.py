"""Check a REST request against Google's own discovery documents, as google-api-python-client ships them offline.

`check(request)` finds the method whose path template and HTTP verb match the request's URL, then checks every
query parameter and every body field against that method's parameters and request schema, recursively through
`$ref` schemas (`additionalProperties` maps included), and every enum value. It returns the problems it found,
each one line naming the request and the field; an empty list means the request is one Google documents.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DOCUMENTS = ("run.v2", "iam.v1", "cloudresourcemanager.v1", "pubsub.v1", "storage.v1", "cloudscheduler.v1",
             "firestore.v1", "serviceusage.v1", "serviceusage.v1beta1", "artifactregistry.v1", "secretmanager.v1",
             "compute.v1", "cloudbuild.v1", "tpu.v2", "cloudbilling.v1")
# Parameters every Google API accepts (system parameters); the `$`-prefixed forms are what the
# google-cloud-* REST transports send (e.g. `$alt=json;enum-encoding=int`).
SYSTEM_PARAMETERS = {"$alt", "$fields", "$prettyPrint", "$callback", "$.xgafv"}


# How the JSON mapping writes these formats (protobuf's JSON mapping, as Google's REST APIs read it).
STRING_FORMATS = {
    "google-duration": re.compile(r"-?\d+(\.\d{1,9})?s"),
    "google-datetime": re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)"),
    "int64": re.compile(r"-?\d+"), "uint64": re.compile(r"\d+"), "int32": re.compile(r"-?\d+"),
    "uint32": re.compile(r"\d+"),
    "byte": re.compile(r"[A-Za-z0-9+/_-]*={0,2}"),
}


def documents_dir() -> Path:
    import googleapiclient

    return Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"


@dataclass(frozen=True)
class Method:
    doc: str
    id: str
    http_method: str
    pattern: re.Pattern
    literal_chars: int  # more literal text: a more specific template
    spec: dict


@cache
def load(name: str) -> dict:
    return json.loads((documents_dir() / f"{name}.json").read_text())


def _template_regex(template: str) -> re.Pattern:
    """A segment variable never spans a '/' or a ':' (where a custom verb such as :getIamPolicy begins)."""
    out, pos = [], 0
    for m in re.finditer(r"\{(\+?)([^}]+)\}", template):
        out.append(re.escape(template[pos:m.start()]))
        out.append(".+" if m.group(1) else "[^/:]+")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("".join(out))


def _methods(resource: dict):
    yield from resource.get("methods", {}).values()
    for child in resource.get("resources", {}).values():
        yield from _methods(child)


@cache
def methods() -> tuple[tuple[str, Method], ...]:
    """(base URL, method) for every method of every document, once per path template."""
    out = []
    for name in DOCUMENTS:
        doc = load(name)
        base = doc["rootUrl"] + doc["servicePath"]
        for spec in _methods(doc):
            # flatPath names each segment ({projectsId}); path's {+name} would match any URL at all.
            template = spec.get("flatPath") or spec["path"]
            literal = len(re.sub(r"\{[^}]+\}", "", template))
            out.append((base, Method(name, spec["id"], spec["httpMethod"], _template_regex(template), literal, spec)))
            # The same method's media URLs: its upload paths (mediaUpload.protocols, from the root URL) and, where
            # the download service serves it, `download/` before the service path (storage's objects.get, alt=media).
            for protocol in ((spec.get("mediaUpload") or {}).get("protocols") or {}).values():
                media = protocol["path"].lstrip("/")
                out.append((doc["rootUrl"], Method(name, spec["id"], spec["httpMethod"], _template_regex(media),
                                                   len(re.sub(r"\{[^}]+\}", "", media)), spec)))
            # A resumable upload begins at the simple path (uploadType=resumable) and sends its data with PUT to the
            # session URI it is given, that path with an upload_id
            # (https://cloud.google.com/storage/docs/performing-resumable-uploads): the same method.
            simple = (((spec.get("mediaUpload") or {}).get("protocols") or {}).get("simple") or {}).get("path")
            if simple and "resumable" in spec["mediaUpload"]["protocols"]:
                media = simple.lstrip("/")
                out.append((doc["rootUrl"], Method(name, spec["id"], "PUT", _template_regex(media),
                                                   len(re.sub(r"\{[^}]+\}", "", media)), spec)))
            if spec.get("supportsMediaDownload") and spec.get("useMediaDownloadService"):
                out.append((doc["rootUrl"] + "download/" + doc["servicePath"],
                            Method(name, spec["id"], spec["httpMethod"], _template_regex(template), literal, spec)))
    return tuple(out)


def find_method(http_method: str, url: str) -> tuple[Method | None, list[Method]]:
    """The best method for this verb and URL, and every method whose path matches (whatever its verb)."""
    by_path = [m for base, m in methods() if url.startswith(base) and m.pattern.fullmatch(url[len(base):])]
    same_verb = sorted((m for m in by_path if m.http_method == http_method), key=lambda m: -m.literal_chars)
    return (same_verb[0] if same_verb else None), by_path


def check(request: dict) -> list[str]:
    where = f"{request['method']} {request['url']}"
    method, by_path = find_method(request["method"], request["url"])
    if method is None:
        if by_path:
            verbs = sorted({m.http_method for m in by_path})
            return [f"{where}: no method takes {request['method']} at this path (documented: {', '.join(verbs)} "
                    f"for {', '.join(sorted({m.id for m in by_path}))})"]
        return [f"{where}: no documented method has this path"]
    doc = load(method.doc)
    problems = []
    params = method.spec.get("parameters", {})
    for key, value in (request.get("query") or {}).items():
        if key in SYSTEM_PARAMETERS or key in doc.get("parameters", {}):
            continue
        spec = params.get(key)
        if spec is None or spec.get("location") != "query":
            problems.append(f"{where} ({method.id}): unknown query parameter {key!r}")
            continue
        problems += _check_value(doc, spec, value, f"{where} ({method.id}): query {key}")
    for key, spec in params.items():
        if spec.get("location") == "query" and spec.get("required") and key not in (request.get("query") or {}):
            problems.append(f"{where} ({method.id}): required query parameter {key!r} is missing")
    body = request.get("body")
    schema = (method.spec.get("request") or {}).get("$ref")
    if schema is None:
        if body not in (None, {}):
            problems.append(f"{where} ({method.id}): takes no body, got {sorted(body) if isinstance(body, dict) else body!r}")
    elif body is not None:
        problems += _check_value(doc, {"$ref": schema}, body, f"{where} ({method.id}): body")
    return problems


def _check_value(doc: dict, spec: dict, value: Any, path: str) -> list[str]:
    if "$ref" in spec:
        spec = {**doc["schemas"][spec["$ref"]], **{k: v for k, v in spec.items() if k != "$ref"}}
    kind = spec.get("type")
    if kind == "any" or value is None:
        return []
    if "enum" in spec:
        allowed = spec["enum"]
        ok = value in allowed or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(allowed))
        return [] if ok else [f"{path}: {value!r} is not one of {allowed}"]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        problems = []
        properties = spec.get("properties", {})
        extra = spec.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                if properties[key].get("readOnly"):
                    problems.append(f"{path}.{key}: output only (readOnly), never sent")
                problems += _check_value(doc, properties[key], item, f"{path}.{key}")
            elif extra is not None:
                problems += _check_value(doc, extra, item, f"{path}.{key}")
            else:
                problems.append(f"{path}.{key}: no such field (known: {', '.join(sorted(properties))})")
        return problems
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [p for i, item in enumerate(value) for p in _check_value(doc, spec.get("items", {}), item, f"{path}[{i}]")]
    if kind == "string":
        fmt = spec.get("format")
        if fmt in ("int64", "uint64", "int32", "uint32") and isinstance(value, int):
            return []
        if not isinstance(value, str):
            return [f"{path}: expected a string, got {value!r}"]
        pattern = STRING_FORMATS.get(fmt)
        return [] if pattern is None or pattern.fullmatch(value) else [f"{path}: {value!r} is not a {fmt}"]
    if kind == "integer":
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value.lstrip("-").isdigit())
        return [] if ok else [f"{path}: expected an integer, got {value!r}"]
    if kind == "number":
        return [] if isinstance(value, (int, float)) and not isinstance(value, bool) else [f"{path}: expected a number, got {value!r}"]
    if kind == "boolean":
        ok = isinstance(value, bool) or value in ("true", "false")
        return [] if ok else [f"{path}: expected a boolean, got {value!r}"]
    return []
