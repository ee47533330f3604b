"""Settings of `python -m pipelines.generate`: every shipped config group composes into the library's
dataclasses, and a bad setting stops the CLI with one line naming it, not a traceback."""

from __future__ import annotations

import itertools
import subprocess

import pytest
from hydra import compose, initialize_config_dir
from pipeline_cli import REPO, generate_cmd, run_env

from opsynth.cluster import ClusterConfig
from opsynth.generate.config import GenerateConfig, generate_config

CONF = REPO / "conf"
GROUPS = {name: sorted(p.stem for p in (CONF / name).glob("*.yaml")) for name in ("cluster", "sampler", "verify", "dedup")}


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="generate", overrides=list(overrides))


def test_the_groups_the_readme_names_exist():
    assert set(GROUPS["cluster"]) >= {"local", "local_cuda", "slurm", "slurm_gpu", "scheduler"}
    assert set(GROUPS["verify"]) >= {"auto", "cpu", "cuda"}
    assert set(GROUPS["sampler"]) >= {"ops6k", "small"}
    assert set(GROUPS["dedup"]) >= {"offline", "default"}


@pytest.mark.parametrize("cluster,verify,sampler,dedup", list(itertools.product(
    GROUPS["cluster"], GROUPS["verify"], GROUPS["sampler"], GROUPS["dedup"])))
def test_every_combination_of_shipped_groups_builds_a_valid_config(cluster, verify, sampler, dedup):
    extra = ["cluster.address=tcp://127.0.0.1:8786"] if cluster == "scheduler" else []
    cfg = generate_config(_compose(f"cluster={cluster}", f"verify={verify}", f"sampler={sampler}",
                                   f"dedup={dedup}", *extra))
    assert isinstance(cfg, GenerateConfig)
    assert cfg.cluster.kind == {"slurm_gpu": "slurm"}.get(cluster, cluster)
    cfg.validate()


def test_defaults_are_the_embedded_local_run():
    cfg = generate_config(_compose())
    assert (cfg.cluster.kind, cfg.verify.device, cfg.sampler.scale) == ("local", "auto", None)
    assert cfg.verify.compile_backend == "inductor"  # what the dataset promises
    assert cfg.dedup.kb_path is None  # a local copy when one is found, else the Hub dataset (cached)
    small = generate_config(_compose("sampler=small"))
    assert small.sampler.scale == 0.1


def test_plain_overrides_reach_the_config():
    cfg = generate_config(_compose("n_tasks=7", "output_dir=/tmp/somewhere", "seed=5", "verify=cpu",
                                   "verify.compile_backend=eager", "cluster.n_workers=3"))
    assert (cfg.n_tasks, cfg.output_dir, cfg.seed) == (7, "/tmp/somewhere", 5)
    assert (cfg.verify.device, cfg.verify.compile_backend, cfg.cluster.n_workers) == ("cpu", "eager", 3)
    assert generate_config(_compose("output_dir=2024")).output_dir == "2024"  # a number-like folder name


@pytest.mark.parametrize("overrides,names", [
    (["+verify.bogus=1"], ["verify", "bogus"]),
    (["+bogus=1"], ["bogus"]),
    (["n_tasks=abc"], ["n_tasks"]),
    (["cluster.threads_per_worker=many"], ["cluster.threads_per_worker"]),
])
def test_unknown_or_mistyped_settings_are_named(overrides, names):
    with pytest.raises(ValueError) as e:
        generate_config(_compose(*overrides))
    for n in names:
        assert n in str(e.value)


def test_validation_names_the_setting():
    with pytest.raises(ValueError, match="n_tasks"):
        GenerateConfig(n_tasks=0).validate()
    with pytest.raises(ValueError, match="cluster.address"):
        GenerateConfig(cluster=ClusterConfig(kind="scheduler")).validate()
    with pytest.raises(ValueError, match="cluster.kind"):
        GenerateConfig(cluster=ClusterConfig(kind="kubernetes")).validate()
    with pytest.raises(ValueError, match="flush_every"):
        GenerateConfig(flush_every=0).validate()


@pytest.mark.slow
def test_cli_config_errors_are_one_clear_line(tmp_path, kernelbench):
    """Each bad call exits 2 with `error: ...` naming the setting, before any cluster starts."""
    cases = {
        "unknown": (["+verify.bogus=1"], ["verify", "bogus"]),
        "zero": (["n_tasks=0"], ["n_tasks"]),
        "no_address": (["cluster=scheduler"], ["cluster.address"]),
    }
    procs = {}
    for name, (overrides, _) in cases.items():  # concurrently: each pays the torch import
        out = tmp_path / name
        procs[name] = subprocess.Popen(generate_cmd(out, *overrides), cwd=REPO, env=run_env(kernelbench),
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for name, (_, names) in cases.items():
        stdout, stderr = procs[name].communicate(timeout=180)
        assert procs[name].returncode == 2, (name, stdout, stderr)
        assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
        line = next(ln for ln in stderr.splitlines() if ln.startswith("error:"))
        for n in names:
            assert n in line, (name, line)
        assert not (tmp_path / name / "data").exists(), "nothing is written for a bad config"


@pytest.mark.parametrize("device,band", [("cpu", (0.05, 100.0, 4.0)), ("cuda", (1.0, 100.0, 24.0))])
def test_the_run_records_the_band_of_the_device_that_verifies(device, band):
    """A CPU run's card and runtimes plot must not show the GPU's 1 ms floor (nor both bands)."""
    from opsynth.generate.config import describe_run
    from opsynth.shards import RunStats

    stats = RunStats()
    describe_run(stats, generate_config(_compose(f"verify={device}")))
    th = stats.thresholds
    assert (th["verify_device"], th["eager_ms_min"], th["eager_ms_max"], th["mem_cap_gb"]) == (device, *band)
    assert not any(k.startswith("cpu_") for k in th)


def test_generate_config_checks_its_own_values_when_built():
    """`__post_init__`: a bad top-level value stops at construction (the groups and the folder are
    checked by `validate()`, just before a run)."""
    for bad, name in (({"n_tasks": 0}, "n_tasks"), ({"output_dir": ""}, "output_dir"), ({"flush_every": 0}, "flush_every")):
        with pytest.raises(ValueError, match=name):
            GenerateConfig(**bad)
    GenerateConfig(cluster=ClusterConfig(kind="scheduler"))  # a group's settings: validate()'s business
