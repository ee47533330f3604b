"""Config plumbing: YAML under conf/verify maps onto VerifyConfig, and the protocol framing."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import yaml

from opsynth.verify import protocol
from opsynth.verify.config import VerifyConfig

CONF = Path(__file__).resolve().parents[2] / "conf" / "verify"


@pytest.mark.parametrize("name", ["cpu", "cuda"])
def test_conf_files_are_valid_verify_configs(name):
    data = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    cfg = VerifyConfig.from_dict(data)
    assert cfg.device == name
    lim = cfg.limits(name)
    assert 0 < lim.min_ms < lim.max_ms
    assert lim.mem_cap_gb <= lim.mem_limit_gb


def test_unknown_key_is_an_error():
    with pytest.raises(ValueError, match="unknown"):
        VerifyConfig.from_dict({"n_wrokers": 2})


def test_cuda_band_is_the_ops6k_rule():
    lim = VerifyConfig().limits("cuda")
    assert (lim.min_ms, lim.max_ms, lim.mem_cap_gb) == (1.0, 100.0, 24.0)


def test_protocol_round_trip_with_partial_reads():
    r, w = os.pipe()
    try:
        # Larger than a pipe buffer: the reader must assemble it from several reads while the
        # writer is still writing.
        msg = {"op": "eager", "source": "x" * 200_000, "n": 3}
        writer = threading.Thread(target=protocol.send, args=(w, msg))
        writer.start()
        reader = protocol.Reader(r)
        assert reader.poll(5.0) == msg
        writer.join(5.0)
        assert reader.poll(0.05) is None
    finally:
        os.close(r)
        os.close(w)


def test_timing_settings_of_the_gpu_config_and_their_checks():
    cfg = VerifyConfig.from_dict(yaml.safe_load((CONF / "cuda.yaml").read_text()))
    assert (cfg.warmup, cfg.repeats, cfg.min_repeats, cfg.timing_rel_tol, cfg.far_samples) == (1, 20, 5, 0.02, 2)
    for bad in ({"timing_rel_tol": -0.01}, {"far_samples": -1}):
        with pytest.raises(ValueError, match="timing_rel_tol and verify.far_samples"):
            VerifyConfig(**bad)
