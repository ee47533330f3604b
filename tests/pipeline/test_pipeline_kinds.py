"""A mixed-precision, mixed-pass generate run on the CPU (real candidates: sample, size, render,
verify in the sandboxed pool, dedup, write): the rows keep the kinds their seeds drew, every row
re-executes in its precision (and a backward row gives every gradient), and the card states the
precisions, their tolerances and the backward loss."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from opsynth.cluster import ClusterHandle
from opsynth.generate import candidate, driver
from opsynth.generate.config import GenerateConfig, candidate_seed
from opsynth.graph import Sampler, SamplerConfig
from opsynth.shards import read_rows

N_TASKS = 8
SEED = 3
MIXED = dict(dtypes={"fp32": 0.5, "bf16": 0.4, "fp16": 0.1}, passes={"forward": 0.6, "backward": 0.4})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    mp = pytest.MonkeyPatch()

    def start_cluster(cfg, run_dir=None):
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None)
        return ClusterHandle(Client(cluster), cluster, "local", 2, False)

    mp.setattr(driver, "start_cluster", start_cluster)
    out = tmp_path_factory.mktemp("kinds") / "ds"
    cfg = GenerateConfig(n_tasks=N_TASKS, output_dir=str(out), seed=SEED, kb_check=False, progress=False, flush_every=4)
    cfg.sampler.scale = 0.1
    cfg.sampler.dtypes, cfg.sampler.passes = dict(MIXED["dtypes"]), dict(MIXED["passes"])
    # One sandbox, the eager backend and a wide band: the test is about kinds, not timing.
    cfg.verify.device, cfg.verify.compile_backend, cfg.verify.n_workers = "cpu", "eager", 2
    cfg.verify.cpu_min_ms, cfg.verify.cpu_max_ms, cfg.verify.preload_compiler = 0.0, 1e6, False
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(summary=driver.run(cfg)), daemon=True)
    t.start()
    t.join(600)
    mp.undo()
    candidate._close_context()
    assert not t.is_alive(), "the run did not finish within 600 s"
    return cfg, out, box["summary"]


def test_rows_keep_the_kinds_their_seeds_drew(run):
    cfg, out, summary = run
    rows = read_rows(out)
    assert len(rows) == N_TASKS, summary
    sampler = Sampler(SamplerConfig(scale=0.1, **MIXED), device="cpu")
    for r in rows:
        assert (r["dtype"], r["task_pass"]) == sampler.draw_kind(r["seed"]), r["seed"]
    kinds = Counter((r["dtype"], r["task_pass"]) for r in rows)
    assert {d for d, _ in kinds} >= {"float32", "bfloat16"} and {p for _, p in kinds} == {"forward", "backward"}, kinds
    # the candidates' kinds (accepted or not) are the draws of seeds 0.. of this run: the mixture is the sampler's
    drawn = Counter(sampler.draw_kind(candidate_seed(SEED, i)) for i in range(summary["candidates"]))
    assert all(drawn[k] >= n for k, n in kinds.items())


def test_every_row_re_executes_in_its_precision_and_pass(run):
    import torch

    from opsynth.render.task_file import (differentiable_inputs, grad_outputs, load_task_module, parameter_names,
                                          task_kind, task_step)

    _, out, _ = run
    for r in read_rows(out):
        kind = task_kind(r["code"])
        assert (kind.dtype, kind.task_pass) == (r["dtype"], r["task_pass"])
        mod = load_task_module(r["code"], "row_task")
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs())
        inputs = mod.get_inputs()
        floats = [x for x in [*inputs, *model.parameters()] if x.is_floating_point()]
        assert floats and all(x.dtype == getattr(torch, r["dtype"]) for x in floats), r["code"]
        with torch.no_grad():
            y = model(*inputs)
        assert y.dtype == getattr(torch, r["dtype"])
        assert [s["dtype"] for s in __import__("json").loads(r["input_shapes"])] == \
               [str(x.dtype).removeprefix("torch.") for x in inputs]
        if kind.backward:
            names = parameter_names(model)
            res = task_step(model, kind, len(inputs), names)(*inputs, *grad_outputs([y], 0))
            grads = res[1:]
            assert len(grads) == len(differentiable_inputs(inputs)) + len(names)
            assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)


def test_the_card_and_report_state_the_precisions(run):
    import json

    _, out, _ = run
    card = (out / "README.md").read_text()
    assert "## Precisions and passes" in card and "`bfloat16`" in card and "sum(output * grad_output)" in card
    report = json.loads((out / "report.json").read_text())
    assert sum(v["rows"] for v in report["rows"]["by_kind"].values()) == N_TASKS
