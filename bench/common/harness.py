"""A benchmark harness that survives its anchors: items measured one by one, each on the record before the next starts,
and a rank group that hangs or dies is restarted where it stopped.

Two halves:
- on the ranks, `Items` runs each named item under a watchdog and appends its result (or its exception) to a JSON-lines
  file (rank 0 writes), after a "start" line; an item already in the file is skipped, so a restarted group resumes;
- the driver (`drive`) starts the rank group with torchrun and, when it ends early (a hang the watchdog ended, a
  crash, a wedged CUDA context or communicator, none of which can go on in the same process), records the item that
  was in flight as failed with the exit code, and starts the group again on the rest.

Also here: candidates drawn from a family's space for any world size and GQA group (`space_candidates`), so no
benchmark carries a hand-written list that a new shape or world size breaks.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: exit code of a rank whose watchdog ended an item that did not return (rank 0 also records a "hung" line first)
HUNG = 3


def read_events(path: Path) -> list[dict]:
    """The JSON lines of `path` (a torn last line, from a killed writer, is dropped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def finished(events: list[dict]) -> dict[str, dict]:
    """Item id -> its result (or error) for every item that ended, as recorded."""
    return {e["id"]: e for e in events if e.get("event") in ("done", "failed")}


class Items:
    """Rank side: run items once each, in order, each under a watchdog; record every result before going on."""

    def __init__(self, path: Path, rank: int, timeout_s: float) -> None:
        self.path, self.rank, self.timeout_s = path, rank, timeout_s
        self.done = finished(read_events(path))

    def _write(self, event: dict, *, any_rank: bool = False) -> None:
        if self.rank == 0 or any_rank:
            with self.path.open("a") as f:
                f.write(json.dumps(event) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def run(self, item_id: str, fn: Callable[[], dict], *, timeout_s: float | None = None) -> dict | None:
        """`fn()`'s result dict (None if a previous group already ran it); an exception is that item's error."""
        if item_id in self.done:
            return None
        self._write({"event": "start", "id": item_id, "t": time.time()})
        limit = timeout_s or self.timeout_s

        def fire() -> None:  # a collective with a stuck peer never returns: only a new process can go on
            print(f"rank {self.rank}: item {item_id} did not finish in {limit:.0f} s; ending the group", flush=True)
            # any rank's watchdog may fire first, and the group ends before the others' do: each records the hang
            self._write({"event": "hung", "id": item_id, "after_s": limit}, any_rank=True)
            os._exit(HUNG)

        dog = threading.Timer(limit, fire)
        dog.daemon = True
        dog.start()
        try:
            result = fn()
            event = {"event": "done", "id": item_id, **result}
        except Exception as exc:
            event = {"event": "done", "id": item_id, "error": f"{type(exc).__name__}: {exc}"[:500]}
            _settle()
        finally:
            dog.cancel()
        self._write(event)
        self.done[item_id] = event
        return event


def _settle() -> None:
    try:
        import torch

        torch.cuda.synchronize()
    except Exception:  # a wedged context: the next item's own failure will show it
        pass


def drive(command: list[str], path: Path, *, restarts: int = 6, group_timeout_s: float = 3600) -> int:
    """Run `command` (a torchrun line that resumes from `path`) until it exits 0 or `restarts` are spent; after each
    early end, the item in flight is recorded as failed (hang or crash, with the exit code) and the group restarts."""
    for attempt in range(restarts + 1):
        start = time.time()
        try:
            code = subprocess.run(command, timeout=group_timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = -9
        if code == 0:
            return 0
        events = read_events(path)
        ended = finished(events)
        open_items = [e for e in events if e.get("event") == "start" and e["id"] not in ended]
        if not open_items:
            print(f"driver: the group exited {code} outside any item; giving up", flush=True)
            return code
        item = open_items[-1]
        hung = any(e.get("event") == "hung" and e["id"] == item["id"] for e in events)
        why = "its watchdog ended it (a hang)" if hung else f"the rank group exited {code} (a crash)"
        error = f"{why} after {time.time() - item['t']:.0f} s; restarted the group on the rest"
        with path.open("a") as f:
            f.write(json.dumps({"event": "failed", "id": item["id"], "error": error}) + "\n")
        print(f"driver: item {item['id']} failed ({why}); restart {attempt + 1} of {restarts} "
              f"after {time.time() - start:.0f} s", flush=True)  # fmt: skip
    return 1


def torchrun_self(nproc: int, script: str, args: list[str], *, port: int = 29500) -> list[str]:
    """The torchrun line that runs `script` with `args` on `nproc` ranks of this node (rendezvous on `port`)."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--master-port={port}",
            script, *args]  # fmt: skip


def space_candidates(space: Any, problem: Any, limits: Any, mode: str, n: int, seed: int = 0) -> list[dict]:
    """Up to `n` valid configs of `mode` for the problem: the space's seeds and default of that mode first, then
    configs drawn at random (seeded: every rank draws the same) from the space restricted to the mode. The baseline:
    one per collective variant the device runs (its other knobs, if any, the default's)."""
    sub = space.restrict({"mode": [mode]})
    out: list[dict] = []
    seen: set[str] = set()

    def add(cfg: dict, *, cap: bool = True) -> None:
        if (len(out) < n or not cap) and not sub.violations(cfg, problem, limits):
            canonical = sub.validate(cfg, problem, limits)
            key = json.dumps(canonical, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(canonical)

    if mode == "baseline":
        base = space.baseline(problem, limits)
        names = [p.name for p in space.params]
        variants = space.param("collective").choices if "collective" in names else (None,)
        for c in variants:  # every variant, whatever `n`: the best unfused path is the fastest of them
            add(base if c is None else {**base, "collective": c}, cap=False)
        return out
    for cfg in space.seeds(problem, limits):
        if cfg.get("mode") == mode:
            add(cfg)
    default = space.default(problem, limits)
    rng = random.Random(seed)

    def complete(given: dict) -> dict:
        """`given`'s values where the mode has those knobs, random choices for the mode's other knobs."""
        cfg: dict = {}
        for p in sub.params:
            if p.when is None or p.when.holds(cfg):
                cfg[p.name] = given[p.name] if p.name in given and p.canonical(given[p.name]) is not None else (
                    rng.choice(p.choices))  # fmt: skip
        return cfg

    if default.get("mode") == mode:
        add(default)
    else:  # the default's shared knobs (flash_decode's decode tiles, a GEMM's tiles) under this mode
        for _ in range(50):
            before = len(out)
            add(complete({**default, "mode": mode}))
            if len(out) > before:
                break
    for _ in range(4000):
        if len(out) >= n:
            break
        add(complete({"mode": mode}))
    return out


def assemble(path: Path, header: dict) -> dict:
    """The result file: the header, then every finished item's record in the order they ran."""
    ended = finished(read_events(path))
    return {**header, "items": [{k: v for k, v in e.items() if k != "event"} for e in ended.values()]}


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1))
