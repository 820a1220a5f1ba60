"""The contracts of what services share through Firestore: every stored state, and typed views of the documents.

Services talk through Pub/Sub (`tpuq.contracts.messages`) and through the documents below.
Every state a document can hold is a member of an enum here, and every reader and
writer compares against and writes those members, so renaming a state is one edit
that every service sees (`tests/unit/test_documents.py` fails if a state literal
reappears elsewhere). Collection names live in `tpuq.contracts.store`; where files live in
GCS, in `tpuq.contracts.gcslayout`. One module per collection (`jobs`, `tpus`, `executions`, `claimer`), the Cloud TPU
API's states and a node's health in `tpuapi`, what they share in `common`; import the names from here.

| collection                   | state field            | typed view                     |
|------------------------------|------------------------|--------------------------------|
| jobs/{job_id}                | `state`: JobState      | `JobDoc` (`tpuq.contracts.jobstate` moves the state) |
| jobs/{job_id}/attempts/{n}   | `state`: AttemptState  | `AttemptDoc`                   |
| tpus/{node}                  | `state`: TpuState      | `TpuDoc`                       |
| requests/{request_id}        | `status`: RequestStatus| `RequestRecord`                |
| queued_resources/{qr_id}     | `state`: QueuedResourceState or ClaimerQrState | `QrRecord` |
| zones/{fleet}:{zone}:{type}  |                        | `TargetRecord`                 |
| fleet_status/{fleet}         |                        | `FleetStatus`                  |
| executions/{job}:{attempt}   | `state`: ExecutionState| `ExecutionDoc`, `ExecutionEnd` (its end) |

Nothing here does I/O: the views convert to and from the dicts Firestore stores.

The job, attempt, TPU and execution views declare their documents' field names once. A reader turns a stored
dict into the view (`JobDoc.from_doc`: every field but `state` is optional, fields it does not know are ignored,
and a state that is not a member of its enum raises `tpuq.contracts.errors.Permanent`, field `state`, naming the document
and the value). A writer never writes the whole view: guarded updates and merges write only the fields they change,
built with `JobDoc.fields(...)` / `AttemptDoc.fields(...)` / `TpuDoc.fields(...)` / `ExecutionDoc.fields(...)`, which
refuse a name the view does not declare. Queries and reads of one field name it with `JobDoc.field(...)` (and so
on), checked the same way. (`TpuDoc.from_doc` keeps `state` as stored: the janitor reads TPUs in any state.)
"""

from tpuq.contracts.documents.claimer import (
    QR_STATES_RACING,
    FleetStatus,
    QrRecord,
    SliceNode,
    RequestRecord,
    RequestStatus,
    TargetRecord,
    qr_from_doc,
    qr_to_doc,
    request_from_doc,
    request_to_doc,
    status_from_doc,
    status_to_doc,
    target_from_doc,
    target_to_doc,
)
from tpuq.contracts.documents.common import parse_timestamp, short_node_name
from tpuq.contracts.documents.executions import ExecutionDoc, ExecutionEnd, ExecutionState, execution_doc_id
from tpuq.contracts.documents.jobs import (
    JOB_STATES_ON_A_TPU,
    TERMINAL_JOB_STATES,
    AttemptDoc,
    AttemptState,
    JobDoc,
    JobState,
)
from tpuq.contracts.documents.tpuapi import (
    MAINTENANCE_HORIZON,
    ClaimerQrState,
    MaintenanceStatus,
    MaintenanceType,
    NodeHealth,
    NodeSymptom,
    QueuedResourceState,
    SymptomType,
    TpuHealth,
    TpuNodeState,
    UpcomingMaintenance,
)
from tpuq.contracts.documents.tpus import TPU_STATES_HOLDING_A_SLICE, TPU_STATES_IN_SERVICE, TpuDoc, TpuState, WorkerEndpoint

__all__ = [
    "MAINTENANCE_HORIZON", "JOB_STATES_ON_A_TPU", "QR_STATES_RACING", "TERMINAL_JOB_STATES",
    "TPU_STATES_HOLDING_A_SLICE", "TPU_STATES_IN_SERVICE",
    "AttemptDoc", "AttemptState", "ClaimerQrState", "ExecutionDoc", "ExecutionEnd", "ExecutionState", "FleetStatus",
    "JobDoc", "JobState", "MaintenanceStatus", "MaintenanceType", "NodeHealth", "NodeSymptom", "QrRecord", "SliceNode",
    "QueuedResourceState", "RequestRecord", "RequestStatus", "SymptomType", "TargetRecord", "TpuDoc", "TpuHealth",
    "TpuNodeState", "TpuState", "UpcomingMaintenance", "WorkerEndpoint",
    "execution_doc_id", "parse_timestamp", "qr_from_doc", "qr_to_doc", "request_from_doc", "request_to_doc",
    "short_node_name", "status_from_doc", "status_to_doc", "target_from_doc", "target_to_doc",
]
