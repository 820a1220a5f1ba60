"""A stand-in for Google Cloud IAM's allow decisions on the requests tpuq sends (no recorder ever refuses anything).

Three tables and one rule:
- `methods.METHODS`: one row per Google API method tpuq sends (deploy's plan and its reads of the project, the
  claimer's queued-resource create, people's read of the dead letters Pub/Sub kept), the permission each needs, on which resource, and the page that says so;
  the service accounts a request attaches (caller needs `iam.serviceAccounts.actAs` on each) and what an attached
  identity must hold itself;
- `roles.ROLES`: for each predefined role tpuq grants, the modelled permissions it holds (source: its
  https://cloud.google.com/iam/docs/understanding-roles entry); roles/owner holds everything but the bucket
  permissions, which owners get from each bucket's default policy;
- `model.Project`: the bindings, as deploy's own grant actions make them (tpuq.deploy.plan, from infra/iam.yaml);
- `model.check(requests, caller, project)`: every refusal, naming the method, the permission, the resource and the
  principal; a request no row describes is a refusal too, so a new kind of request needs a new row.

Used by tests/deploy/test_iam_model.py: every request of a deploy made as tpuq-deploy (cloudbuild.yaml's account)
and as a project owner, and the claimer's create as tpuq-claimer; and by every local stack: `recording` records each
call a service makes, as its service account, and `calls` checks them when the stack stops (DevStack.running), the
same rows serving a REST request and its gRPC twin (`Method.grpc`).

What it cannot see (docs/ARCHITECTURE.md, "Local stand-ins and production"): IAM conditions (deploy grants none;
a conditional binding is ignored), deny policies and organisation policies (a project under either may refuse what
the model allows), propagation delay (a grant takes effect at once here; in Google Cloud it can take minutes, and a
new account may be unknown for 60 s or more: production-facts.md), permissions Google checks on resources outside
the project (a job bucket in another project, the producer's servicemanagement.services.bind), whether an object
exists (an upload that may replace one is asked for storage.objects.delete), and the calls of the dashboard and the
workers (the stack does not start them under the recorder).
"""
