"""A run that stops at max_candidates short of n_tasks fails loudly, so `generate && push` stops."""

from pipeline_cli import generate_cmd, run_env, run_generate


def test_shortfall_exits_nonzero_with_a_message(tmp_path, kernelbench):
    out = tmp_path / "ds"
    # Nothing can land in a 0.0001 ms band: every candidate is rejected before torch.compile.
    cmd = generate_cmd(out, "n_tasks=1", "max_candidates=2", "verify=cpu", "verify.cpu_max_ms=0.0001",
                       "verify.calibrate=false", "sampler=small", "cluster.threads_per_worker=2", "progress=false")
    proc = run_generate(cmd, run_env(kernelbench), timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "only 0 of n_tasks=1 rows" in proc.stderr
