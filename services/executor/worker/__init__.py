"""tpuq's worker-side agent: prepares the workspace, runs the job detached, reports to GCS.

The modules of this package are joined into ONE file (tpuq.executor.supervisor_bundle),
which is copied to every TPU worker over SFTP on every attempt and run with the
system python (`/usr/bin/python3`, 3.9+: Ubuntu 22.04 TPU images have 3.10), so they
use the standard library only, import nothing from tpuq, and import each other only
as `from .module import name` (the bundle is one flat namespace). The executor
talks to it with one JSON object on stdin (`prepare`) or command-line flags, and
reads one JSON object from its stdout.

Only the bundle is run (`launch` starts `supervise` from the very file it was
loaded from); tests import the modules to reach single functions.

Subcommands (HOME is the login user's home, or --home for tests):

    prepare            spec JSON on stdin. Stops what an earlier attempt left
                       running, replaces the workspace, downloads and checks the
                       bundle, sorts the caches, removes a stale libtpu lockfile,
                       and runs the preflight (answers kind `preflight` on a
                       dirty host: an infrastructure failure, not the job's).
                       Idempotent for the attempt that is already there.
    launch --attempt-id ID
                       starts `supervise` detached (own session) and returns once
                       the job's process group exists.
    cancel --attempt-id ID [--reason R] [--grace S]
                       asks the supervisor to TERM the job's group (KILL after the
                       grace); stops an orphaned group itself.
    status [--attempt-id ID]
                       what is running here, and the local copy of the final status.
    supervise          (internal) the detached supervisor.

Worker file layout:

    ~/tpuq/supervisor.py          the bundle of these modules (replaced atomically each attempt)
    ~/tpuq/attempt/               control files of the latest attempt on this worker
        spec.json                 the spec `prepare` received
        prepared                  the attempt id, once the workspace is ready
        state.json                supervisor pid, job process group, attempt id
        supervisor.lock           flock held by the live supervisor
        job.lock                  flock held (inherited) by the job's processes
        cancel                    cancel request: {"reason", "grace_seconds"}
        output.log                the job's stdout+stderr as the supervisor read them
        status.json               local copy of the final status object
        supervisor.err            the supervisor's own stderr
    ~/tpuq/job/                   JOB_DIR: the extracted bundle; cache paths are
                                  symlinks into ~/tpuq-cache/<key>
    ~/tpuq-cache/<key>/           caches; `.ready` marks a cache a job finished
                                  writing (its supervisor saw exit code 0)
    /tmp/libtpu_lockfile          removed by `prepare` when no process holds it

Modules, each importing only those above it:

    errors       SetupError (the job's inputs are wrong) and InfraError (retrying may help)
    files        WorkerPaths and small JSON/tree helpers
    spec         the spec `prepare` reads
    bundle       tar member checks and extraction
    gcs          a stdlib GCS JSON API client
    processes    flocks, process groups, signals, reaping (liveness is judged by flocks)
    caches       which caches to keep, and their links into JOB_DIR
    status       the final status object, local and in GCS
    logs         the job's output to output.log and to GCS in chunks
    notice       the preemption and maintenance notice, polled from the metadata server while the job runs
    preflight    is the host fit: TPU devices or libtpu's lock held by another process, too little disk
    workspace    `prepare`
    supervision  `supervise`
    control      `launch`, `cancel`, `status`
    main         argv
"""
