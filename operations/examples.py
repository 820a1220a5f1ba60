"""The files `tpuq init` writes: a commented fleet file and job.yaml."""

EXAMPLE_FLEET = """\
# tpuq fleet file: which TPUs tpuq may claim, where, and under which budgets.
# Check it with `tpuq validate fleet.yaml`; store it with `tpuq fleet apply fleet.yaml` (or `tpuq deploy`).
name: research                  # lowercase letters, digits, '-'
project: my-trc-project         # the GCP project holding your TPU quota
owner_prefix: tpuq              # every queued resource tpuq creates is named and labelled with this;
                                # tpuq never deletes anything without both
idle_timeout_seconds: 600       # delete a TPU that has been idle this long
ssh_transport: direct           # vpc (the executor reaches internal IPs) | direct (external IPs) | iap (= vpc)
ssh_key_secret: tpuq-executor-ssh  # the Secret Manager NAME of the executor's SSH key pair; never put a key in
                                # this file. Make the pair once (`tpuq deploy --dry-run` prints these too):
# ssh-keygen -q -t ed25519 -N '' -C tpuq-executor -f ./tpuq-executor-ssh
# gcloud secrets create tpuq-executor-ssh --data-file=./tpuq-executor-ssh --project=my-trc-project
# gcloud secrets create tpuq-executor-ssh-public --data-file=./tpuq-executor-ssh.pub --project=my-trc-project
# rm ./tpuq-executor-ssh ./tpuq-executor-ssh.pub
worker_secrets: []              # Secret Manager secret NAMES (never values) the TPU workers may read,
                                # e.g. `gcloud secrets versions access latest --secret=NAME` in the command
job_buckets:                    # every bucket your jobs list under `buckets:` (job.yaml's two): deploy lets the
  - gs://my-training-us-central2  # workers read bundles from and write logs to each (tpuq never creates them)
  - gs://my-training-us-east1
firestore_location: nam5        # where deploy creates the Firestore database (nam5, eur3 or a region);
                                # default: deploy's --region. It cannot change once the database exists
retry:
  preemptions: 20               # retries after spot preemptions (per job)
  infra_failures: 2             # retries after infrastructure failures (per job)
claim:
  valid_until_seconds: 43200    # a queued request expires by itself after this
  unknown_error_retries: 1      # an unknown error (or the region's external IP quota) is retried once after a
                                # back-off, then that zone and type stop for unknown_error_backoff_seconds
  unknown_error_backoff_seconds: 3600
  hedge_seconds: 0              # 0: race every zone at once; N: one zone first, the next after N s without capacity
budget:
  vm_hours_per_day: 200         # claiming stops for the (UTC) day once the day's VM-hours (hosts x hours alive),
                                # plus one more hour of every slice alive and of the new one, would pass this
grant_expires: 2026-12-31       # your TRC grant's last day (UTC; grants last about 30 days): nothing is claimed after it
quota:                          # optional override, in chips: before queueing, tpuq reads each zone's quota
                                # from the Cloud Quotas API (and skips zones without); a value here wins over it.
                                # Declare v2, v3, on-demand v4 and v5p here: their quota IDs are not known to tpuq.
                                # Leave the section out to use the API's values alone.
  us-central2-b:
    v4: {spot: 64}
  europe-west4-a:
    v5e: {spot: 64}
  us-east1-d:
    v6e: {spot: 64}
tpus:
  - id: v4-spot
    type: v4-32                 # 4 hosts, 16 chips
    zones: [us-central2-b]
    count: 2                    # at most 2 slices held at once (PROVISIONING or ACTIVE); every zone
                                # with quota is raced meanwhile, and the losers are cancelled
    keep_warm_count: 0          # slices kept even when idle
    provisioning_model: spot    # spot | on_demand
  - id: v5e-spot
    type: v5litepod-64          # 16 hosts: under direct each gets an external IP (validate warns); vpc gives internal IPs only
    zones: [europe-west4-a]
    count: 1
  - id: v6e-spot
    type: v6e-64
    zones: [us-east1-d]
    count: 1
    single_slot: true           # one request at a time, never raced alongside other types (scarce types
                                # fill one slot at a time); unset: true for v6e, false for the others
"""

EXAMPLE_JOB = """\
# tpuq job file. Submit with `tpuq submit job.yaml`; check with `tpuq validate job.yaml`.
jobs:
  - name: train
    tpu: [v4-32, v6e-64]        # one type, or several compatible types to race
    buckets:                    # one bucket per region you accept; the winner's is JOB_BUCKET. Each is
                                # listed under job_buckets in fleet.yaml, so the workers may write it
      - gs://my-training-us-central2
      - gs://my-training-us-east1
    bundle: .                   # this directory, uploaded once per bucket (.tpuqignore and .tpu-runnerignore exclude files)
    priority: normal            # low | normal | high
    caches:                     # kept on a worker for the next job that declares the same key,
      - key: pip                # once the job touches <path>/.ready
        path: .cache/pip
    env:
      PIP_CACHE_DIR: .cache/pip
    command: >-
      python3 -m pip install -r requirements.txt && touch "$PIP_CACHE_DIR/.ready" &&
      python3 train.py --checkpoints "$CHECKPOINT_GCS_DIR"
"""

LOCAL_JOB_TEMPLATE = """\
# A tpuq job for the local stack as `tpuq dev up` starts it (its fleet offers {tpu} in us-central2; `tpuq fleet`
# lists the entries). Submit with `tpuq submit job.yaml --wait`; follow with `tpuq watch JOB` or `tpuq logs JOB`.
jobs:
  - name: hello
    tpu: {tpu}
    buckets:                    # the job bucket `tpuq dev up` made for the fleet's region (it lists them)
      - gs://{bucket}
    bundle: .                   # this directory, uploaded to the bucket
    command: >-
      echo "hello from worker $TPU_WORKER_ID of $TPU_WORKER_COUNT on $TPU_WORKER_HOST" &&
      ls "$JOB_DIR" && echo "JOB_BUCKET=$JOB_BUCKET"
"""


def local_job() -> str:
    """`tpuq init --local`'s job.yaml: runs on the local stack's default fleet as it is."""
    from tpuq.operations.stackenv import LOCAL_DEFAULT_BUCKET, LOCAL_DEFAULT_TYPE

    return LOCAL_JOB_TEMPLATE.format(tpu=LOCAL_DEFAULT_TYPE, bucket=LOCAL_DEFAULT_BUCKET)
