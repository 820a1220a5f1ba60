"""The claimer's watch, observed once per distinct set of answers: a queued resource whose API answers are the
same as at its last observation gets that observation again.

A watch pass GETs every live queued resource (and the node of each ACTIVE one) each tick and turns the answers
into an `Observation` (`tpuq.claimer.tpuapi.TpuApi.observe`): most answers are the same as the pass before.
`observe` is a function of the queued resource's record and of the answers, so here:

- the record is the same object (`tpuq.runtime.versioned` keeps one parse per stored version: a changed record is
  another object), and
- every call the last observation made is made again, in the same order, through the cloud (counted as any
  call), and each answers the same body (`SimCloud`'s `body_key`),

then the last observation is the answer. Otherwise the observation is made afresh by the real `observe`, and the
calls already made for the comparison answer its first calls (`SimTpuClient.prefetched`): each call is made once,
as without this, and the run's counts are the same. An observation whose calls failed is not kept.
"""

from __future__ import annotations

from typing import Any


class RepeatedObservations:
    """A mixin before `TpuApi` whose `client` is a `SimTpuClient`: `observe` as above."""

    client: Any

    def observe(self, qr):
        client = self.client
        kept = client.observed.get(qr.qr_id)
        if kept is not None and kept[0] is qr:
            fetched = []
            for kind, name, key in kept[1]:
                try:
                    answer = client.fetch(kind, name)
                except Exception as e:  # noqa: BLE001 - the real observe gets it, from `prefetched`
                    fetched.append((kind, name, e))
                    break
                fetched.append((kind, name, answer))
                if answer[1] != key:
                    break
            else:
                return kept[2]
            client.prefetched = fetched
        client.recording = []
        try:
            observation = super().observe(qr)  # type: ignore[misc]
        finally:
            calls, unused = client.recording, client.prefetched
            client.recording, client.prefetched = None, []
        if unused:
            raise RuntimeError(f"observe({qr.qr_id}) did not make the calls it made last time: {unused!r}")
        if all(key is not None for _, _, key in calls):
            if len(client.observed) >= 20_000:
                client.observed.clear()
            client.observed[qr.qr_id] = (qr, calls, observation)
        else:
            client.observed.pop(qr.qr_id, None)
        return observation
