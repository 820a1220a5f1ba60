"""Core (pure, no I/O): where a multislice job's gang of slices goes in one pass of `tpuq.scheduler.plan`.

A multislice job (`slices: N`, tpuq.contracts.multislice) needs N idle slices of its type *at once, in one zone*
(one class of interchangeable TPUs: type, zone, region; never a TPU some job names exactly). The elastic form
`slices: [4, 2]` takes the largest listed count any class can give.

How it keeps `plan`'s guarantees on a mixed queue (single and multislice jobs), in scheduling order:
- a single job is matched exactly as before, by an augmenting path; its slice may still move to let a later job in;
- a gang, when its turn comes, goes to a class where N are free (the one with the fewest free, so that larger
  holes stay for larger gangs); else to a class where single jobs matched before it can *move elsewhere* to free
  the rest: each move is an augmenting path from the class to a free TPU outside it, which keeps every earlier job
  matched. Freeing k slices of one class by successive shortest paths is a maximum flow, so if that class cannot
  give N this way no rearrangement of the single jobs can;
- a matched gang is pinned: later searches never move it (its slices are taken out of the class, not put in the
  flow), and no earlier job is ever dropped for a later one.
So a job is passed over only when no zone can hold it without dropping an earlier job or moving an earlier gang.
(Choosing zones for several gangs at once is a packing problem, NP-hard in general; this is the greedy rule in
scheduling order, which is what "priority first" asks for.) A queue without multislice jobs takes exactly the
old path: no gang code runs.
"""

from __future__ import annotations

from collections import deque

from tpuq.scheduler.residual import Residual, shortest_path

# (class, signature, change of flow) or (class, None, change of free): enough to undo a failed attempt.
Undo = list[tuple[int, int | None, int]]


def place_gang(counts: tuple[int, ...], classes: list[int], r: Residual) -> tuple[int, int] | None:
    """(class, count) for a gang that may use `classes` (counts largest first, each > 1), with its slices taken
    out of `r.free`; or None, leaving everything as it was. Moves single jobs elsewhere when that frees enough."""
    free, flow, sig_dead = r.free, r.flow, r.sig_dead
    for n in counts:
        fitting = [c for c in classes if free[c] >= n]
        if fitting:
            best = min(fitting, key=lambda c: (free[c], c))  # best fit: keep the largest holes for larger gangs
            free[best] -= n
            return best, n
        # Most free first: the fewest moves; only classes whose free and movable slices could reach n.
        for c in sorted(classes, key=lambda c: (-free[c], c)):
            if free[c] + sum(k for s, k in flow[c].items() if not sig_dead[s]) < n:
                continue
            undo: Undo = []
            while free[c] < n and _move_one_away(c, r, undo):
                pass
            if free[c] >= n:
                free[c] -= n
                return c, n
            _undo(undo, r)
    return None


def _move_one_away(target: int, r: Residual, undo: Undo) -> bool:
    """Free one slice of class `target`: a shortest path that moves one of its single jobs to another class, and
    so on, ending at a free TPU outside `target`. False (nothing changed) if none exists. Marks nothing dead: the
    nodes it reaches may still reach the free slices of `target` itself."""
    reached_from_class = {s: target for s, count in r.flow[target].items() if count > 0 and not r.sig_dead[s]}
    end, reached_from_sig = shortest_path(r, deque(reached_from_class), reached_from_class, avoid=target)
    if end < 0:
        return False
    _change_free(end, -1, r, undo)
    c = end
    while c != target:
        s = reached_from_sig[c]
        _change_flow(c, s, +1, r, undo)
        left = reached_from_class[s]
        _change_flow(left, s, -1, r, undo)
        c = left
    _change_free(target, +1, r, undo)
    return True


def _change_flow(c: int, s: int, delta: int, r: Residual, undo: Undo) -> None:
    count = r.flow[c].get(s, 0) + delta
    if count:
        r.flow[c][s] = count
    else:
        r.flow[c].pop(s, None)
    undo.append((c, s, delta))


def _change_free(c: int, delta: int, r: Residual, undo: Undo) -> None:
    r.free[c] += delta
    undo.append((c, None, delta))


def _undo(undo: Undo, r: Residual) -> None:
    for c, s, delta in reversed(undo):
        if s is None:
            r.free[c] -= delta
        else:
            _change_flow(c, s, -delta, r, [])
