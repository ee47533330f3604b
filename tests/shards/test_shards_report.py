from __future__ import annotations

import json

import pytest

from opsynth.shards.report import write_report
from opsynth.shards.stats import RunStats
from opsynth.shards.writer import ShardWriter

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ["mixture", "categories", "runtimes", "speedup", "kb_similarity", "rejections"]


def _stats() -> RunStats:
    s = RunStats(
        n_tasks=12,
        target_mixture={"torch#1": 1, "torch#2": 2, "torch#3": 1},  # normalised by the report
        categories={"nn.Conv2d": "convolution", "torch.relu": "activation", "torch.sum": "reduction",
                    "nn.LayerNorm": "normalization"},
        thresholds={"eager_ms_min": 1.0, "eager_ms_max": 100.0, "kb_similarity_max": 0.9},
        wall_time_s=30.0,
    )
    s.accept(12)
    for reason, n in {"eager_too_fast": 3, "kb_too_similar": 1}.items():
        s.reject(reason, n)
    return s


def test_report_json_and_every_plot(tmp_path, make_row):
    rows = [make_row(i) for i in range(12)]
    rows[0]["ops"] = ["nn.Conv2d", "aten.unknown_op"]
    rejections = [{"reason": "eager_too_fast", "seed": s, "detail": "x" * 2000} for s in range(3)]
    report = write_report(tmp_path, _stats(), rows, rejections)

    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(report))
    r = on_disk["rows"]
    assert r["num_rows"] == 12
    assert r["mixture"]["torch#2"] == {"rows": 4, "achieved": pytest.approx(1 / 3), "target": 0.5,
                                       "delta": pytest.approx(1 / 3 - 0.5)}
    # rows cycle through 1, 2, 3 ops: conv in all 12, relu in 8, sum in 4, layernorm in none
    assert r["category_coverage"] == {"convolution": 12, "activation": 8, "reduction": 4, "normalization": 0}
    assert r["uncategorised_ops"] == ["aten.unknown_op"]
    assert r["eager_ms"]["min"] == 1.0 and r["eager_ms"]["max"] == 6.5 and r["eager_ms"]["count"] == 12
    assert r["compile_speedup"]["min"] == pytest.approx(1.0 / 0.8)
    assert r["kb_max_similarity"]["count"] == 9  # 3 rows carry no similarity
    rej = on_disk["rejections"]
    assert rej["counts"] == {"eager_too_fast": 3, "kb_too_similar": 1} and rej["total"] == 4
    assert len(rej["examples"]["eager_too_fast"]) == 3
    assert len(rej["examples"]["eager_too_fast"][0]["detail"]) < 600
    run = on_disk["run"]
    assert run["acceptance_rate"] == pytest.approx(12 / 16) and run["candidates_per_minute"] == pytest.approx(32.0)
    assert sorted(on_disk["plots"]) == sorted(PLOTS)
    for name in PLOTS:
        png = tmp_path / on_disk["plots"][name]
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5_000


def test_report_reads_the_shards_when_rows_are_not_given(tmp_path, make_row):
    w = ShardWriter(tmp_path, rows_per_shard=4)
    w.write([make_row(i) for i in range(9)])
    w.finalize()
    stats = RunStats()
    stats.reject("timeout")
    report = write_report(tmp_path, stats)
    assert report["rows"]["num_rows"] == 9
    assert report["rejections"]["counts"] == {"timeout": 1}


def test_an_empty_run_still_reports(tmp_path):
    report = write_report(tmp_path, RunStats(), rows=[], rejections=[{"reason": "compile_failed"}])
    assert report["rows"]["eager_ms"]["count"] == 0
    assert report["rejections"]["counts"] == {"compile_failed": 1}
    assert all((tmp_path / p).exists() for p in report["plots"].values())
    with pytest.raises(ValueError, match="reason"):
        write_report(tmp_path, RunStats(), rows=[], rejections=[{"seed": 1}])


def test_run_stats_counts_and_round_trips():
    s = RunStats(wall_time_s=0.0)
    assert s.acceptance_rate is None and s.candidates_per_minute is None
    s.accept(3)
    s.reject("eager_too_fast", 2)
    s.reject("eager_too_fast")
    d = s.to_dict()
    assert d["candidates"] == 6 and d["num_rejected"] == 3 and d["acceptance_rate"] == 0.5
    assert RunStats.from_dict(json.loads(json.dumps(d))) == s
    with pytest.raises(ValueError):
        s.reject("")


def test_progress_bar_shows_accepted_rejected_and_rate():
    import io

    from opsynth.shards.progress import RunProgress

    buf = io.StringIO()
    stats = RunStats()
    rows = [5]  # the folder's rows, as the writer counts them: 5 from an earlier run
    with RunProgress(stats, total=20, file=buf, disable=False, mininterval=0, rows=lambda: rows[0]) as bar:
        stats.accept(3)
        rows[0] += 3
        stats.reject("timeout")
        bar.update()
    text = buf.getvalue()
    assert "5/20" in text and "8/20" in text  # starts from the rows already there
    assert "rejected=1" in text and "accept_rate=75%" in text and "cand/min=" in text


def test_progress_redirected_to_a_file_is_whole_lines_and_a_terminal_gets_the_bar():
    """`generate ... 2> run.log`: one line per update worth saying, no `\r`-joined redraws."""
    import io

    from opsynth.shards.progress import RunProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream in (io.StringIO(), Terminal()):
        stats = RunStats()
        with RunProgress(stats, total=4, file=stream, disable=False, mininterval=0, line_interval_s=0) as bar:
            for _ in range(4):
                stats.accept()
                bar.update()
        text = stream.getvalue()
        if isinstance(stream, Terminal):
            assert "\r" in text and "4/4" in text  # tqdm's bar, redrawn in place
        else:
            lines = text.splitlines()
            assert "\r" not in text and lines[0].startswith("accepted 0/4 ") and lines[-1].startswith("accepted 4/4 ")
            assert len(lines) == 5, lines  # the start and each change, each once


def test_the_runtime_plots_name_the_compile_backend_that_timed_them(tmp_path):
    import numpy as np

    from opsynth.shards.report import _plot_runtimes, _plot_speedup

    eager = np.array([0.5, 1.0, 2.0])
    th = {"verify_device": "cpu", "eager_ms_min": 0.05, "eager_ms_max": 100.0, "compile_backend": "aot_eager"}
    ax = _plot_runtimes(eager, eager * 1.2, th, tmp_path / "runtimes.png").axes[0]
    assert "torch.compile (aot_eager)" in [t.get_text() for t in ax.get_legend().get_texts()]
    ax = _plot_speedup(eager / (eager * 1.2), tmp_path / "speedup.png", th).axes[0]
    assert ax.get_title() == "torch.compile (aot_eager) speedup over eager"


def _tick_labels(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


def test_runtimes_plot_draws_the_band_of_the_device_that_verified_with_whole_task_counts(tmp_path):
    import numpy as np

    from opsynth.shards.report import _plot_runtimes

    eager = np.array([0.06, 0.07, 0.08, 0.1, 0.12, 0.2, 0.3])  # a CPU run: most below the GPU's 1 ms
    th = {"verify_device": "cpu", "eager_ms_min": 0.05, "eager_ms_max": 100.0}
    ax = _plot_runtimes(eager, eager * 1.2, th, tmp_path / "runtimes.png").axes[0]
    assert sorted(float(line.get_xdata()[0]) for line in ax.lines) == [0.05, 100.0]
    assert "eager band (cpu)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(float(t).is_integer() for t in ax.get_yticks()), ax.get_yticks()
    assert len(_tick_labels(ax.xaxis)) >= 4


def test_speedup_plot_labels_a_narrow_log_range_readably(tmp_path):
    import numpy as np

    from opsynth.shards.report import _plot_speedup

    speedup = np.array([0.62, 0.7, 0.71, 0.85, 0.86, 0.9, 1.1])
    ax = _plot_speedup(speedup, tmp_path / "speedup.png").axes[0]
    labels = _tick_labels(ax.xaxis)
    assert len(labels) >= 4 and "1" in labels, labels
    assert all(0.5 < float(x) < 1.5 for x in labels)  # plain numbers, no 10^k notation
    assert all(float(t).is_integer() for t in ax.get_yticks())


def test_count_plots_have_whole_number_ticks(tmp_path):
    import numpy as np

    from opsynth.shards.report import _plot_barh, _plot_similarity

    ax = _plot_barh({"too_fast": 3, "constant_output": 1}, "t", "candidates", "rejections", tmp_path / "b.png").axes[0]
    assert all(float(t).is_integer() for t in ax.get_xticks())
    ax = _plot_similarity(np.array([0.1, 0.2, 0.2]), {"kb_similarity_max": 0.9}, tmp_path / "s.png").axes[0]
    assert all(float(t).is_integer() for t in ax.get_yticks())


def test_diversity_counts_distinct_sequences_and_signatures_per_block():
    from opsynth.shards.report import diversity

    rows = [{"ops": ["nn.Conv2d", "torch.relu"], "sig": "a"}, {"ops": ["nn.Conv2d", "torch.relu"], "sig": "b"},
            {"ops": ["nn.Linear"], "sig": "c"}, {"ops": ["nn.Conv2d", "torch.relu"], "sig": "a"},
            {"ops": ["torch.tanh"], "sig": "d"}]
    d = diversity(rows, signature_of=lambda r: r["sig"], block=2)
    assert d["distinct_op_sequences"] == 3 and d["distinct_graph_signatures"] == 4
    assert d["distinct_op_sequences_per_1000_rows"] == 600.0
    assert d["distinct_graph_signatures_per_1000_rows"] == 800.0
    assert d["new_op_sequences_per_block"] == [1, 1, 1]
    assert d["new_graph_signatures_per_block"] == [2, 1, 1]
    no_sig = diversity(rows)
    assert no_sig["distinct_graph_signatures"] is None and no_sig["distinct_op_sequences"] == 3
    assert diversity([])["distinct_op_sequences_per_1000_rows"] is None
