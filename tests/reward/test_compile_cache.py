"""A task's torch.compile caches kept from one batch's compile baseline child to the next
(`opsynth.reward.compile_cache`): what the parent keeps, what the child starts from, and a real
compile child that hits inductor's FX graph cache because of it (with the control: the same run
with the store switched off compiles from nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opsynth.reward import RewardConfig, baselines, compile_cache

CANDS = Path(__file__).parent / "candidates"
CHAIN = (CANDS / "tasks" / "chain.py").read_text()


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
    """One compile baseline child of the chain task (as a batch starts it), compiled and ready; its
    FX graph cache hits. Closing it joins the store's harvest."""
    from opsynth.render.task_file import DEFAULT_MODE, task_kind

    kind = task_kind(CHAIN)
    ref_job = {"task_mode": DEFAULT_MODE, "task_kind": {"dtype": kind.dtype, "task_pass": kind.task_pass},
               "init_seed": 1, "trial_seeds": [2, 3]}
    cfg = RewardConfig(device="cpu", cache_dir=cache, cpu_threads=1, compile_cache=on)
    srv = baselines.BaselineServer("compile", CHAIN, ref_job, cfg, "cpu")
    try:
        srv.wait_ready()
        assert srv.error is None, srv.error
        return srv.info.get("cache_hits")
    finally:
        srv.close()


@pytest.mark.slow
def test_a_compile_child_starts_from_the_tasks_store_and_hits_the_fx_graph_cache(tmp_path):
    cache = str(tmp_path / "cache")
    assert _compile_child_hits(cache, on=True) == 0  # a new store: compiled from nothing, and kept
    assert any(compile_cache.store_for(cache, CHAIN, "cpu").joinpath("inductor").rglob("*"))
    assert _compile_child_hits(cache, on=False) == 0  # control: without the store, compiled from nothing again
    assert _compile_child_hits(cache, on=True) >= 1
