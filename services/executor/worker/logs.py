"""Log streaming: the job's output into a local file, and in chunks to GCS while it runs."""

from __future__ import annotations

import os
import threading

from .gcs import Gcs

LOG_BUFFER_LIMIT = 16 * 1024 * 1024  # output kept in memory while GCS is unreachable
LOG_CHUNK_LIMIT = 8 * 1024 * 1024  # one simple upload


class OutputPump:
    """Reads the job's merged stdout/stderr into a local file and a buffer for GCS."""

    def __init__(self, fd: int, log_path: str):
        self._fd = fd
        self._log = open(log_path, "ab")
        self._buffer = bytearray()
        self._dropped = 0
        self._lock = threading.Lock()
        self.eof = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                try:
                    block = os.read(self._fd, 65536)
                except InterruptedError:
                    continue
                if not block:
                    break
                self._log.write(block)
                self._log.flush()
                with self._lock:
                    self._buffer += block
                    overflow = len(self._buffer) - LOG_BUFFER_LIMIT
                    if overflow > 0:
                        # GCS has been unreachable for a while: keep the newest output.
                        del self._buffer[:overflow]
                        self._dropped += overflow
        finally:
            os.close(self._fd)
            self._log.close()
            self.eof.set()

    def take(self) -> bytes:
        with self._lock:
            data = bytes(self._buffer[:LOG_CHUNK_LIMIT])
            if self._dropped:
                data = f"[tpuq: {self._dropped} bytes of output dropped while GCS was unreachable]\n".encode() + data
                self._dropped = 0
            del self._buffer[:LOG_CHUNK_LIMIT]
            return data

    def put_back(self, data: bytes) -> None:
        with self._lock:
            self._buffer[:0] = data

    def pending(self) -> bool:
        with self._lock:
            return bool(self._buffer) or bool(self._dropped)


class LogUploader:
    def __init__(self, spec: dict):
        cfg = spec["gcs"]
        self._gcs = Gcs(cfg["api_base"], cfg.get("token_url"))
        self._bucket = cfg["bucket"]
        self._prefix = cfg["log_prefix"]
        self.chunks = 0
        self.bytes = 0
        self.last_error: str | None = None  # the latest failed upload's reason (e.g. "GCS 403: ...")

    def flush(self, pump: OutputPump) -> bool:
        """Upload what is buffered as the next chunk; on failure keep it for the next try."""
        while pump.pending():
            data = pump.take()
            name = f"{self._prefix}{self.chunks:06d}.txt"
            try:
                # if_absent: a retried upload whose first try landed must not overwrite a later chunk.
                self._gcs.upload(self._bucket, name, data, "text/plain; charset=utf-8", if_absent=True)
            except Exception as e:  # noqa: BLE001 - keep the data, try again at the next interval
                pump.put_back(data)
                self.last_error = " ".join(str(e).split())[:160]
                return False
            self.chunks += 1
            self.bytes += len(data)
        return True

    def failure(self) -> str:
        """For the status: the logs did not all reach GCS (the job's output is still in the local output.log)."""
        return f"could not be written to gs://{self._bucket}: {self.last_error or 'unknown error'}"
