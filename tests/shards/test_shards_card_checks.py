"""The card says how sizes were chosen (reference rates, the run's measured peaks, how predictions
compared) and which checks are bitwise and which use a tolerance; its counts describe the last run
and all runs apart."""

from __future__ import annotations

import dataclasses

from opsynth.shards.card import write_card
from opsynth.shards.stats import RunStats
from opsynth.shards.writer import ShardWriter
from opsynth.verify import VerifyConfig


def test_the_card_names_the_sizing_and_which_checks_are_exact(tmp_path, make_row):
    with ShardWriter(tmp_path / "ds", rows_per_shard=10) as w:
        w.write([make_row(i) for i in range(12)])
        w.finalize()
    s = RunStats(device="NVIDIA H200", config={"verify": dataclasses.asdict(VerifyConfig())}, runs=2,
                 resumed_rows=7, run_added_rows=5, run_wall_time_s=60.0, wall_time_s=150.0,
                 reference_rates={"device_kind": "cuda", "tflops": 50.0, "gbps": 3900.0, "gelems": 500.0,
                                  "kernel_us": 6.0},
                 measured_peaks={"device": "NVIDIA H200", "tflops": 51.2, "gbps": 4100.0, "gelems": 480.0,
                                 "kernel_us": 4.0},
                 cost_model={"rows": 12, "eager_over_predicted_median": 1.1, "p10": 0.5, "p90": 2.5,
                             "near_edge_rows": 1},
                 thresholds={"task_mem_budget_mb": 17261.0})
    s.accept(12)
    body = write_card(tmp_path / "ds", s).read_text()
    assert "## Sizes and checks" in body
    cpu = RunStats(device="cpu", config={"verify": dataclasses.asdict(VerifyConfig())},
                   reference_rates={"device_kind": "cpu", "tflops": 1.0, "gbps": 10.0, "gelems": 1.0, "kernel_us": 5.0})
    cpu.accept(12)
    assert "times 2.5 must fit the" in write_card(tmp_path / "ds", cpu).read_text()
    assert "50 TFLOP/s, 3,900 GB/s, 500 G exp/s, 6 us per kernel call" in body and "measured `NVIDIA H200` at 51.2 TFLOP/s" in body
    assert "median 1.10 (10th to 90th percentile 0.50 to 2.50)" in body and "1 rows measured within 25 %" in body
    assert "inside [1.0 x (1 + 0.2), 100.0 x (1 - 0.1)] ms" in body
    # a CUDA run names the CUDA factor (verify.mem_safety_cuda), not the CPU's
    assert "times 1.5 must fit the 17,261 MB one request may use" in body and "`predicted_oom`" in body
    assert "split_by_source" not in body  # no slot had a wider budget
    s.thresholds = {"task_mem_budget_mb": 4224.0, "task_mem_budget_mb_by_source": {"torch#1": 18816.0}}
    wide = write_card(tmp_path / "ds", s).read_text()
    assert "Candidates of torch#1 (18,816 MB) were sized against a larger share of the device (`verify.split_by_source`)" in wide
    assert "| finite, not constant | no NaN or Inf; not every element equal to the first | bitwise |" in body
    assert "atol 1e-06, rtol 1e-05 | tolerance (cuDNN algorithms and atomics may reorder sums) |" in body
    for line in ("| runs that built this folder | 2 |", "| rows present when the last run started | 7 |",
                 "| rows added by the last run | 5 |", "| wall time, last run | 1.0 min |",
                 "| wall time, all runs | 2.5 min |"):
        assert line in body, line


def test_the_card_and_report_show_the_mixture_quotas_and_their_rejections(tmp_path, make_row):
    """A run filled by quota: the mixture table has each slot's quota, the checks table names the
    rule and its rejection, which the rejections table counts; the report's mixture has the quotas.
    (Control: a run without quotas shows none of it.)"""
    from opsynth.shards.report import write_report

    with ShardWriter(tmp_path / "ds", rows_per_shard=10) as w:
        w.write([make_row(i) for i in range(12)])  # 4 rows each of torch#1..3
        w.finalize()
    quota = {"quotas": {"torch#1": 4, "torch#2": 4, "torch#3": 4}, "rows": {"torch#1": 4, "torch#2": 4, "torch#3": 4},
             "given_up": ["torch#4"], "give_up_after": 200, "pre_verifier_miss": 0.1, "reason": "mixture_slot_full"}
    target = {"torch#1": 0.33, "torch#2": 0.33, "torch#3": 0.33, "torch#4": 0.01}
    s = RunStats(device="cpu", config={"verify": dataclasses.asdict(VerifyConfig())}, target_mixture=target,
                 mixture_quota=quota)
    s.accept(12)
    s.reject("mixture_slot_full", 7)
    body = write_card(tmp_path / "ds", s).read_text()
    assert "| data_source | rows | achieved | target | quota |" in body
    assert "| `torch#2` | 4 | 33.33 % | 33.00 % | 4 |" in body and "| `torch#4` | 0 | 0.00 % | 1.00 % | – |" in body
    assert "| mixture quota |" in body and "(`mixture_slot_full` otherwise) | exact |" in body
    assert "| `mixture_slot_full` | 7 |" in body
    assert "Given up, after 200 of their candidates in a row were rejected" in body and "`torch#4`" in body
    assert "one rejected before verification, at sampling, sizing or the KernelBench check, counted 0.1 of one" in body
    report = write_report(tmp_path / "ds", s)
    assert report["rows"]["mixture"]["torch#1"]["quota"] == 4

    plain = RunStats(device="cpu", config={"verify": dataclasses.asdict(VerifyConfig())}, target_mixture=target)
    plain.accept(12)
    body = write_card(tmp_path / "ds", plain).read_text()
    assert "| data_source | rows | achieved | target |\n" in body and "mixture quota" not in body
    assert "quota" not in write_report(tmp_path / "ds", plain)["rows"]["mixture"]["torch#1"]


def test_the_card_and_report_show_the_precision_and_pass_quotas(tmp_path, make_row):
    """A run with a precision and pass mixture filled by quota: the checks row names every axis, the
    precisions section has each value's rows and quota (and which was given up), the report counts
    the rows against the quotas. (Control: slot quotas alone show no axis table.)"""
    from opsynth.shards.report import write_report

    rows = [{**make_row(i), "dtype": "bfloat16" if i % 2 else "float32", "task_pass": "backward" if i < 3 else "forward"}
            for i in range(12)]
    with ShardWriter(tmp_path / "ds", rows_per_shard=10) as w:
        w.write(rows)
        w.finalize()
    slots = {"quotas": {"torch#1": 4, "torch#2": 4, "torch#3": 4}, "rows": {"torch#1": 4, "torch#2": 4, "torch#3": 4},
             "given_up": [], "give_up_after": 200, "reason": "mixture_slot_full"}
    axes = {"dtype": {"quotas": {"bfloat16": 6, "float32": 6}, "rows": {"bfloat16": 6, "float32": 6}, "given_up": []},
            "task_pass": {"quotas": {"backward": 3, "forward": 9}, "rows": {"backward": 3, "forward": 9},
                          "given_up": ["backward"]}}
    s = RunStats(device="cpu", config={"verify": dataclasses.asdict(VerifyConfig())}, mixture_quota={**slots, "axes": axes})
    s.accept(12)
    body = write_card(tmp_path / "ds", s).read_text()
    assert "the candidate's `data_source` slot, `dtype` and `task_pass` each holds fewer rows than its quota" in body
    assert "| axis | value | rows | quota | given up |" in body
    assert "| `dtype` | `bfloat16` | 6 | 6 |  |" in body and "| `task_pass` | `backward` | 3 | 3 | yes |" in body
    report = write_report(tmp_path / "ds", s)
    assert report["rows"]["kind_mixture"]["task_pass"]["backward"] == {"rows": 3, "quota": 3, "given_up": True}
    assert report["rows"]["kind_mixture"]["dtype"]["float32"] == {"rows": 6, "quota": 6, "given_up": False}

    plain = RunStats(device="cpu", config={"verify": dataclasses.asdict(VerifyConfig())}, mixture_quota=slots)
    plain.accept(12)
    body = write_card(tmp_path / "ds", plain).read_text()
    assert "| mixture quota |" in body and "| axis | value |" not in body
    assert "kind_mixture" not in write_report(tmp_path / "ds", plain)["rows"]
