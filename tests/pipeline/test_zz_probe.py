import os, sys
sys.path.insert(0, "/work/main/tests/pipeline")
from test_pipeline_driver import _cfg, _run_with_deadline
from opsynth.generate import driver

def test_probe(tmp_path, monkeypatch):
    def process(index, seed, sampler_cfg, verify_cfg, dedup_cfg, kb_check=True, committed=None, prepare_processes=None, claims=None):
        return {"index": index, "seed": seed, "accepted": False, "reason": "too_fast", "row": None,
                "signature": None, "evidence": None}
    def peaks(sampler_cfg, verify_cfg, dedup_cfg, kb_check=True):
        return {"kind": "cpu", "measured": {}, "reference": {}}
    monkeypatch.setattr(driver, "process_candidate", process)
    monkeypatch.setattr(driver, "measure_peaks", peaks)
    cfg = _cfg(tmp_path / "ds", 1, max_candidates=3)
    cfg.cluster.n_workers, cfg.cluster.threads_per_worker = 1, 1
    recs = []
    s = _run_with_deadline(cfg, seconds=180)
    print("EVIDENCE", s["rejected"], [r.get("evidence") for r in recs])
