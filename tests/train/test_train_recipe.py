"""The recipe that carries to a real model, each setting on the CPU with a small randomly
initialised transformers model built from a config (no download; `recipe_run.py`):

- the `lora`, `vllm` and `gradient_checkpointing` settings build through the shared config
  builder into dataclasses, and a bad value is one line naming the setting;
- TRL's vLLM generation settings reach the GRPOConfig TRL reads (vLLM itself is not installable
  here, so generating with it is not tested);
- LoRA through peft with gradient checkpointing trains: only the adapters change, checkpoints hold
  the adapter, `final/` is the merged model (loadable like any checkpoint), and `resume=true`
  continues from the last checkpoint;
- `accelerate launch` with 2 CPU processes trains a step.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose(config_name="train", overrides=overrides)


def _from_yaml(overrides: list[str]):
    from omegaconf import OmegaConf

    from opsynth.train.trainer import TrainSettings

    values = OmegaConf.to_container(_compose(overrides), resolve=True)
    values.pop("hydra", None)
    return TrainSettings.from_dict(values)


def test_recipe_blocks_are_dataclasses_from_the_yaml_and_bad_values_are_one_line():
    from opsynth.train.recipe import LoraSettings, VllmSettings
    from opsynth.train.trainer import TrainSettings

    s = _from_yaml(["lora.enabled=true", "lora.r=8", "lora.target_modules=[q_proj,v_proj]", "vllm.mode=server"])
    assert isinstance(s.lora, LoraSettings) and s.lora.enabled and s.lora.r == 8
    assert s.lora.target_modules == ["q_proj", "v_proj"]
    assert isinstance(s.vllm, VllmSettings) and s.vllm.mode == "server" and s.gradient_checkpointing is None
    bad = {
        "lora.r must be an integer >= 1, got 0": {"lora": {"r": 0}},
        "lora.dropout must be in [0, 1)": {"lora": {"dropout": 1.5}},
        "lora.target_modules must be 'all-linear' or a list": {"lora": {"target_modules": [""]}},
        "vllm.mode must be one of ('colocate', 'server'), got 'remote'": {"vllm": {"mode": "remote"}},
        "vllm.gpu_memory_utilization must be in (0, 1]": {"vllm": {"gpu_memory_utilization": 1.5}},
        "vllm.server_port must be int": {"vllm": {"server_port": "eighty"}},
        "unknown lora setting(s) ['alhpa'] (did you mean 'alpha'?)": {"lora": {"alhpa": 8}},
        "trainer.use_vllm is set by vllm.enabled": {"trainer": {"use_vllm": True}},
        "gradient_checkpointing=True and trainer.gradient_checkpointing=False disagree":
            {"gradient_checkpointing": True, "trainer": {"gradient_checkpointing": False}},
    }
    for message, values in bad.items():
        with pytest.raises(ValueError, match=re.escape(message)) as e:
            TrainSettings.from_dict({"shards": ".", **values})
        assert "\n" not in str(e.value)


def test_vllm_settings_reach_the_grpo_config_trl_reads(tmp_path):
    from opsynth.train.trainer import grpo_config

    s = _from_yaml([f"output_dir={tmp_path}", "trainer=grpo", "vllm.enabled=true", "vllm.mode=server",
                    "vllm.server_base_url=http://gen:8000", "vllm.gpu_memory_utilization=0.55",
                    "vllm.tensor_parallel_size=2", "vllm.max_model_length=8192", "vllm.enable_sleep_mode=true",
                    "vllm.importance_sampling_correction=false"])
    args = grpo_config(s, use_cpu=True)
    assert args.use_vllm is True and args.vllm_mode == "server" and args.vllm_server_base_url == "http://gen:8000"
    assert args.vllm_gpu_memory_utilization == 0.55 and args.vllm_tensor_parallel_size == 2
    assert args.vllm_max_model_length == 8192 and args.vllm_enable_sleep_mode is True
    assert args.vllm_importance_sampling_correction is False
    off = grpo_config(_from_yaml([f"output_dir={tmp_path}", "trainer=grpo"]), use_cpu=True)
    assert off.use_vllm is False  # the default: transformers generation
    # gradient checkpointing: explicit wins; left unset, off on the CPU
    assert grpo_config(_from_yaml([f"output_dir={tmp_path}", "gradient_checkpointing=true"]), use_cpu=True).gradient_checkpointing
    assert not grpo_config(_from_yaml([f"output_dir={tmp_path}"]), use_cpu=True).gradient_checkpointing


def _shards(folder: Path) -> str:
    from bandit import task_source, write_task_shards

    return write_task_shards(str(folder), task_source(), n=2)


@pytest.mark.slow
def test_lora_with_gradient_checkpointing_trains_checkpoints_and_resumes(tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, TrainerCallback

    from recipe_run import run, tiny_model

    seen = {}

    class Look(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kw):
            seen["peft"] = hasattr(model, "peft_config")
            seen["checkpointing"] = bool(getattr(model, "is_gradient_checkpointing", False))
            names = [n for n, p in model.named_parameters() if p.requires_grad]
            seen["trainable"] = names

    shards, out = _shards(tmp_path / "shards"), tmp_path / "run"
    lora = {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0}
    summary = run(shards, str(out), 2, callbacks=[Look()], lora=lora, gradient_checkpointing=True)
    assert summary["global_step"] == 2 and summary["lora"]
    assert seen["peft"] and seen["checkpointing"], seen
    assert seen["trainable"] and all("lora_" in n for n in seen["trainable"]), seen["trainable"][:4]
    assert (out / "checkpoint-2" / "adapter_model.safetensors").exists()
    assert not (out / "checkpoint-2" / "model.safetensors").exists()  # a checkpoint holds the adapter only
    assert (out / "final" / "adapter" / "adapter_config.json").exists()
    final = AutoModelForCausalLM.from_pretrained(str(out / "final"))  # the merged model, as any checkpoint loads
    weights = load_file(str(out / "final" / "model.safetensors"))
    assert not any("lora" in k for k in weights)
    base = tiny_model(0)[0].state_dict()
    changed = [k for k, v in final.state_dict().items() if k in base and not torch.equal(v, base[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed), changed[:5]  # LoRA's targets, merged in

    resumed = run(shards, str(out), 3, lora=lora, gradient_checkpointing=True, resume=True)
    assert resumed["resumed_from"].endswith("checkpoint-2") and resumed["global_step"] == 3
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward" in r] == [1, 2, 3]


@pytest.mark.slow
def test_accelerate_launches_two_cpu_processes_that_train_a_step(tmp_path):
    # accelerate's --cpu alone starts several CPU processes only through MPI (mpirun); its torchrun
    # launcher (--multi_gpu) with no GPU visible starts them with the gloo backend, as here.
    shards, out = _shards(tmp_path / "shards"), tmp_path / "run"
    os.makedirs(out)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu", "--main_process_port", "0",
           str(HERE / "recipe_run.py"), "--shards", shards, "--out", str(out), "--steps", "1", "--lora"]
    proc = subprocess.run(cmd, env=env, cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launched = json.loads((out / "launched.json").read_text())
    assert launched["num_processes"] == 2 and launched["backend"] == "gloo", launched
    assert launched["summary"]["global_step"] == 1 and launched["summary"]["lora"], launched
    evals = [json.loads(line) for name in ("evaluations-rank0.jsonl", "evaluations-rank1.jsonl")
             for line in (out / name).read_text().splitlines()]
    assert len(evals) == 8  # each rank judged its own half of the step's 2 groups of 4
    assert (out / "final" / "model.safetensors").exists()
