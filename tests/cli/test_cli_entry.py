"""opsynth.cli: the contract every `python -m pipelines.<command>` shares. A usage error is one line
`error: ...` on stderr naming the setting and what would be valid (exit 2), a misspelled key gets a
close match, Ctrl-C is one line (exit 130). The toy command here imports no torch, so the entry
itself is tested in subprocesses that take well under a second each."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opsynth import cli
from opsynth.generate.config import GenerateConfig

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Inner:
    depth: int = 1
    hidden: float = 0.5  # a field the YAML does not list


@dataclasses.dataclass
class Toy:
    n_items: int = 3
    out: str = "x"
    mode: str = "ok"
    inner: Inner = dataclasses.field(default_factory=Inner)
    extra: dict = dataclasses.field(default_factory=dict)  # any key under it is the library's business


@pytest.fixture
def conf(tmp_path) -> Path:
    d = tmp_path / "conf"
    (d / "flavour").mkdir(parents=True)
    (d / "toy.yaml").write_text("defaults:\n  - flavour: plain\n  - _self_\nn_items: 3\nout: x\nmode: ok\n"
                                "inner:\n  depth: 1\nextra: {}\n")
    (d / "flavour" / "plain.yaml").write_text("sweet: false\n")
    (d / "flavour" / "sugary.yaml").write_text("sweet: true\n")
    (d / "needs.yaml").write_text("path: ???\nother: 1\n")
    return d


def check(conf, *overrides, name="toy", **kw):
    return cli.check_overrides(name, list(overrides), {"": Toy}, config_dir=conf, **kw)


def usage(conf, *overrides, **kw) -> str:
    with pytest.raises(cli.UsageError) as e:
        check(conf, *overrides, **kw)
    return str(e.value)


def test_a_misspelled_key_gets_its_close_match_and_the_valid_keys(conf):
    msg = usage(conf, "n_item=5")
    assert msg.startswith("unknown setting 'n_item' (did you mean 'n_items'?)")
    assert "n_items" in msg and "mode" in msg and "groups: flavour=" in msg


def test_a_nested_unknown_key_lists_its_own_group_only(conf):
    msg = usage(conf, "inner.dept=2")
    assert "(did you mean 'inner.depth'?)" in msg
    assert "inner settings: depth, hidden" in msg and "n_items" not in msg


def test_no_suggestion_when_nothing_is_close(conf):
    msg = usage(conf, "inner.bogus=1")
    assert "did you mean" not in msg and "unknown setting 'inner.bogus'" in msg


def test_a_dataclass_field_the_yaml_lacks_is_passed_on_with_force_add(conf):
    assert check(conf, "inner.hidden=0.9", "n_items=4") == ["++inner.hidden=0.9", "n_items=4"]
    assert check(conf, "extra.anything=1") == ["++extra.anything=1"]  # open dict field
    assert check(conf, "+inner.hidden=0.9") == ["+inner.hidden=0.9"]  # the user's own + is kept


def test_a_group_option_that_does_not_exist_lists_the_options(conf):
    msg = usage(conf, "flavour=sugar")
    assert msg.startswith("flavour=sugar is not an option (did you mean flavour=sugary?)")
    assert "plain, sugary" in msg


def test_an_unreadable_override_says_how_to_write_one(conf):
    assert "write key=value" in usage(conf, "n_items")


def test_a_missing_mandatory_value_is_named_with_its_hint(conf):
    msg = usage(conf, name="needs", required={"path": "add path=<a folder>"})
    assert msg == "path is required: add path=<a folder>"
    assert check(conf, "path=/tmp", name="needs") == ["path=/tmp"]
    assert check(conf, name="needs", required={"path": None}) == []  # left to the command


def test_the_generate_schema_knows_nested_and_open_keys():
    keys, open_prefixes = cli.schema_keys({"": GenerateConfig})
    assert {"n_tasks", "verify.cpu_max_ms", "sampler.scale", "dedup.kb_threshold", "cluster.address"} <= keys
    assert "cluster.slurm" in open_prefixes


def test_the_real_generate_config_rejects_n_task_and_accepts_unlisted_verify_keys():
    with pytest.raises(cli.UsageError, match=r"did you mean 'n_tasks'\?"):
        cli.check_overrides("generate", ["n_task=5"], {"": GenerateConfig})
    # verify=auto's YAML lists neither key; both are VerifyConfig / ClusterConfig fields
    out = cli.check_overrides("generate", ["verify=auto", "verify.max_tasks_per_worker=50", "cluster.slurm.cores=4",
                                           "n_tasks=3"], {"": GenerateConfig})
    assert out == ["verify=auto", "++verify.max_tasks_per_worker=50", "++cluster.slurm.cores=4", "n_tasks=3"]


def test_a_script_composes_the_settings_the_command_would_run():
    """cli.compose, what benchmarks/generate_throughput.py builds its windows' settings with: a
    VerifyConfig key the YAML lacks is accepted as on the command line (Hydra's compose alone refuses
    it: the window benchmark failed on `verify.sizing_split=4` before any window)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    from opsynth.generate.config import generate_config

    overrides = ["verify=cuda", "verify.sizing_split=4", "prepare_processes=2"]
    with initialize_config_dir(config_dir=str(cli.CONF_DIR), version_base=None), \
            pytest.raises(ConfigCompositionException, match="sizing_split"):
        compose(config_name="generate", overrides=overrides)
    cfg = cli.compose("generate", overrides, {"": GenerateConfig})
    assert "hydra" not in cfg
    gen = generate_config(cfg)
    assert (gen.verify.sizing_split, gen.prepare_processes, gen.verify.device) == (4, 2, "cuda")
    with pytest.raises(cli.UsageError, match="sizing_splt"):
        cli.compose("generate", ["verify.sizing_splt=4"], {"": GenerateConfig})


TOY = """
import dataclasses
from opsynth import cli

@dataclasses.dataclass
class Inner:
    depth: int = 1
    hidden: float = 0.5

@dataclasses.dataclass
class Toy:
    n_items: int = 3
    out: str = "x"
    mode: str = "ok"
    inner: Inner = dataclasses.field(default_factory=Inner)
    extra: dict = dataclasses.field(default_factory=dict)

@cli.entry("toy", fields={{"": Toy}}, config_dir={conf!r}, usage_errors=(FileNotFoundError,),
           interrupted=lambda cfg: f"interrupted: kept {{cfg.n_items}} item(s); run the same command again to resume")
def main(cfg):
    if cfg.mode == "interrupt":
        raise KeyboardInterrupt
    if cfg.mode == "usage":
        raise cli.UsageError("mode=usage is not a mode; modes: ok, interrupt")
    if cfg.mode == "missing":
        open("/nonexistent/file")
    if cfg.mode == "bug":
        raise ZeroDivisionError("a bug keeps its traceback")
    print("ran", cfg.n_items, cfg.inner.hidden)

if __name__ == "__main__":
    main()
"""


@pytest.fixture
def toy(tmp_path, conf):
    script = tmp_path / "toy_main.py"
    script.write_text(textwrap.dedent(TOY.format(conf=str(conf))))

    def run(*args):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.run([sys.executable, str(script), f"hydra.run.dir={tmp_path / 'hydra'}", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    return run


def _one_error_line(proc) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_entry_runs_the_command_with_promoted_keys(toy):
    proc = toy("n_items=7", "inner.hidden=0.25")
    assert proc.returncode == 0, proc.stderr
    assert "ran 7 0.25" in proc.stdout


def test_entry_unknown_key_is_one_line_exit_2(toy):
    proc = toy("n_item=7")
    assert proc.returncode == 2
    assert "did you mean 'n_items'?" in _one_error_line(proc)


def test_entry_usage_errors_of_the_command_are_one_line_exit_2(toy):
    for mode, text in (("usage", "mode=usage is not a mode"), ("missing", "/nonexistent/file")):
        proc = toy(f"mode={mode}")
        assert proc.returncode == 2, (mode, proc.stderr)
        assert text in _one_error_line(proc)


def test_entry_ctrl_c_is_one_line_exit_130(toy):
    proc = toy("mode=interrupt", "n_items=4")
    assert proc.returncode == 130
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "interrupted: kept 4 item(s); run the same command again to resume"


def test_entry_a_bug_keeps_its_traceback(toy):
    proc = toy("mode=bug")
    assert proc.returncode == 1 and "ZeroDivisionError" in proc.stderr


def test_fields_given_as_a_function_are_built_only_for_a_key_the_yaml_lacks(conf):
    calls = []

    def fields():
        calls.append(1)
        return {"": Toy}

    assert cli.check_overrides("toy", ["n_items=4"], fields, config_dir=conf) == ["n_items=4"]
    assert calls == []  # a plain run never imports the command's dataclasses here
    assert cli.check_overrides("toy", ["inner.hidden=1"], fields, config_dir=conf) == ["++inner.hidden=1"]
    assert calls == [1]
