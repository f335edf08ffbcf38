"""Dynamic shapes: a key function that buckets the token count keeps a decode workload's keys few."""

from __future__ import annotations

from pathlib import Path

import torch
from test_decorator_helpers import BEST, World, sleep_record

from jointtune.autotune.runtime.decorator import joint_autotune
from jointtune.db import open_store
from jointtune.search_spaces import next_pow2


def test_decode_like_workload_resolves_few_keys(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'local.db'}"
    for m in (1, 16, 256):
        open_store(db).upsert_record(sleep_record(m, BEST))
    resolved: list[int] = []

    def bucket(x: torch.Tensor, *, world: World) -> dict[str, int]:
        return {"M": next_pow2(x.shape[0])}  # tokens to the next power of two

    @joint_autotune(space="jt_sleep", key=bucket, db_url=db)
    def launch(x: torch.Tensor, *, world: World, config) -> int:
        resolved.append(x.shape[0])
        return config["tile"]

    world = World(2)
    ms = [1 + (7 * step) % 300 for step in range(2000)]  # batch sizes of a decode loop: 1..300
    tiles = {launch(torch.empty(m), world=world) for m in ms}
    assert len(set(ms)) == 300 and len(launch.cache) == 10  # 1, 2, 4, ..., 512
    assert tiles == {BEST["tile"]}
    assert sorted(launch.sources.values()).count("store") == 3  # the tuned buckets; the rest nearest
