"""A task's torch.compile caches kept from one batch's compile baseline child to the next
(`opsynth.reward.compile_cache`): what the parent keeps, what the child starts from, and a real
compile child that hits inductor's FX graph cache because of it (with the control: the same run
with the store switched off compiles from nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opsynth.reward import RewardConfig, baselines, compile_cache, evaluate

CANDS = Path(__file__).parent / "candidates"
CHAIN = (CANDS / "tasks" / "chain.py").read_text()
WRONG = (CANDS / "cpu" / "ext_prelude.py").read_text() + "\n" + (CANDS / "cpu" / "wrong.py").read_text()


def test_harvest_keeps_regular_files_only_and_never_overwrites(tmp_path):
    scratch, store = tmp_path / "child", compile_cache.store_for(tmp_path / "cache", "task", "cpu")
    (scratch / "inductor" / "fxgraph" / "ab").mkdir(parents=True)
    (scratch / "inductor" / "fxgraph" / "ab" / "entry").write_bytes(b"graph")
    (scratch / "triton" / "k").mkdir(parents=True)
    (scratch / "triton" / "k" / "kernel.cubin").write_bytes(b"cubin")
    secret = tmp_path / "secret"
    secret.write_text("key")
    os.symlink(secret, scratch / "inductor" / "link")  # a child's link to what it could not read itself
    os.symlink(tmp_path, scratch / "inductor" / "dirlink")
    (store / "triton" / "k").mkdir(parents=True)
    (store / "triton" / "k" / "kernel.cubin").write_bytes(b"kept")
    assert compile_cache.harvest(scratch, store) == 1
    assert (store / "inductor" / "fxgraph" / "ab" / "entry").read_bytes() == b"graph"
    assert (store / "triton" / "k" / "kernel.cubin").read_bytes() == b"kept"  # what the store had stays
    assert not (store / "inductor" / "link").exists() and not (store / "inductor" / "dirlink").exists()
    assert oct((store / "inductor" / "fxgraph" / "ab" / "entry").stat().st_mode & 0o777) == "0o644"


def test_harvest_leaves_out_files_past_the_caps(tmp_path, monkeypatch):
    scratch, store = tmp_path / "child", compile_cache.store_for(tmp_path / "cache", "task", "cpu")
    (scratch / "inductor").mkdir(parents=True)
    (scratch / "inductor" / "big").write_bytes(b"x" * 100)
    (scratch / "inductor" / "small").write_bytes(b"x" * 10)
    monkeypatch.setattr(compile_cache, "MAX_FILE_BYTES", 50)
    assert compile_cache.harvest(scratch, store) == 1 and not (store / "inductor" / "big").exists()
    (scratch / "inductor" / "more").write_bytes(b"x" * 10)
    monkeypatch.setattr(compile_cache, "MAX_STORE_BYTES", 15)  # the store holds 10 bytes already
    assert compile_cache.harvest(scratch, store) == 0


def test_seed_copies_the_store_into_the_childs_own_folders(tmp_path):
    store = compile_cache.store_for(tmp_path / "cache", "task", "cpu")
    (store / "inductor" / "fxgraph" / "ab").mkdir(parents=True)
    (store / "inductor" / "fxgraph" / "ab" / "entry").write_bytes(b"graph")
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "s" / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "s" / "triton")}
    assert compile_cache.seed(store, env) == 1
    assert (tmp_path / "s" / "inductor" / "fxgraph" / "ab" / "entry").read_bytes() == b"graph"


def test_one_store_per_task_and_device(tmp_path):
    a = compile_cache.store_for(tmp_path, "task a", "cpu")
    assert a == compile_cache.store_for(tmp_path, "task a", "cpu")
    assert a != compile_cache.store_for(tmp_path, "task b", "cpu") != compile_cache.store_for(tmp_path, "task a", "cuda")


def _compile_child_hits(cache: str, on: bool) -> int:
    """One evaluation (an incorrect candidate: the compile child is started with the eager child and
    compiles whatever the candidate does), from an empty pool; the compile child's cache hits."""
    with baselines._pool_lock:
        old = list(baselines._pool.values())
        baselines._pool.clear()
    for s in old:
        s.close()
    cfg = RewardConfig(device="cpu", cache_dir=cache, static_check=False, cpu_threads=1, prebuild=False, warmup=3,
                       repeats=10, compile_prestart=True, compile_cache=on)
    r = evaluate(CHAIN, WRONG, cfg)
    assert r.reason.startswith("incorrect"), r.log[-2000:]
    [srv] = [s for s in list(baselines._pool.values()) if Path(s.job["task_path"]).read_text() == CHAIN]
    srv.wait_ready()
    hits = srv.info.get("cache_hits")
    srv.close()  # joins the store's harvest
    with baselines._pool_lock:
        baselines._pool.clear()
    return hits


@pytest.mark.slow
def test_a_compile_child_starts_from_the_tasks_store_and_hits_the_fx_graph_cache(reward_cache):
    _compile_child_hits(reward_cache, on=True)  # fills the store (or finds it filled by an earlier test)
    assert any(compile_cache.store_for(reward_cache, CHAIN, "cpu").joinpath("inductor").rglob("*"))
    assert _compile_child_hits(reward_cache, on=False) == 0  # control: without the store, compiled from nothing
    assert _compile_child_hits(reward_cache, on=True) >= 1
