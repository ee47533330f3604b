"""benchmarks/reward_stability.py's calibration arithmetic, without evaluating anything: which counts the
refinement times between the ladder's bracketing points, and which count each target gets from the
refined curve (linear where the curve passes the target once, nearest measured point by running max
where noise makes it pass more than once)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import reward_stability as rs  # noqa: E402

# The H200's ladder on 2026-12-03 (ms by FMA count), eager 0.4454 ms.
H200 = [(0, 0.3690), (8, 0.3698), (16, 0.3867), (32, 0.4097), (64, 0.6718), (128, 0.8385), (256, 1.2392),
        (512, 2.5854), (1024, 4.6154), (2048, 9.2136)]
EAGER = 0.4454


def test_the_brackets_are_the_ladder_points_either_side_of_each_target():
    assert rs.bracket(H200, 0.85 * EAGER) == (8, 16)
    assert rs.bracket(H200, 1.0 * EAGER) == (32, 64)
    assert rs.bracket(H200, 1.2 * EAGER) == (32, 64)
    assert rs.bracket(H200, 0.5 * EAGER) is None  # below the floor: nothing to refine
    assert rs.bracket(H200, 30 * EAGER) is None  # past the ladder


def test_refine_counts_are_whole_evenly_spaced_inside_each_bracket_and_shared():
    counts = rs.refine_counts(H200, [t * EAGER for t in (0.85, 1.0, 1.2)], 5, integer=True)
    # 8..16 in six steps of 1.33, rounded; 32..64 once for both 1.0 and 1.2
    assert counts == [9.0, 11.0, 12.0, 13.0, 15.0, 37.0, 43.0, 48.0, 53.0, 59.0]
    assert rs.refine_counts(H200, [EAGER], 0, integer=True) == []
    # a bracket of adjacent whole counts has nothing inside; ladder counts are not timed again
    assert rs.refine_counts([(0, 1.0), (1, 2.0)], [1.5], 4, integer=True) == []
    assert rs.refine_counts([(0, 1.0), (2, 2.0)], [1.5], 4, integer=True) == [1.0]
    # CPU: fractional counts, to 0.001
    assert rs.refine_counts([(1, 1.0), (1.5, 2.0)], [1.5], 3, integer=False) == [1.125, 1.25, 1.375]


def test_a_monotone_refined_curve_interpolates_between_its_own_points():
    coarse, _ = rs.choose_reps(H200, EAGER)
    assert coarse == pytest.approx(36.36, abs=0.01)  # what the H200 run chose (36.363 from unrounded times)
    # the refined points show the bend right after 32
    refined = sorted(H200 + [(37, 0.52), (43, 0.56), (48, 0.59), (53, 0.62), (59, 0.65)])
    reps, note = rs.choose_reps(refined, EAGER)
    assert note == "" and 32 < reps < 37
    assert reps == pytest.approx(32 + (EAGER - 0.4097) / (0.52 - 0.4097) * 5)
    reps, note = rs.choose_reps(refined, 1.2 * EAGER)
    assert note == "" and 37 < reps < 43
    # the ladder alone's edge cases are kept
    assert rs.choose_reps(H200, 0.5 * EAGER)[0] == 0 and "below the ladder" in rs.choose_reps(H200, 0.5 * EAGER)[1]
    assert "extrapolated" in rs.choose_reps(H200, 30 * EAGER)[1]


def test_a_non_monotone_curve_takes_the_nearest_measured_point_by_running_max_and_says_so():
    noisy = [(32, 0.41), (37, 0.46), (43, 0.44), (48, 0.47), (53, 0.43), (59, 0.50), (64, 0.67)]
    reps, note = rs.choose_reps(noisy, 0.445)
    # running max 0.41, 0.46, 0.46, 0.47, 0.47, 0.50, 0.67: 37 and 43 tie at 0.46; 43's own 0.44 is nearer
    assert reps == 43 and "not monotone" in note and "5 times" in note
    assert reps in {r for r, _ in noisy}  # a measured count, not an interpolation
    # noise only on the floor (0 vs 8) does not stop interpolation for a target well above it
    floor_noise = [(0, 0.370), (8, 0.368), (16, 0.387), (32, 0.410), (64, 0.672)]
    reps, note = rs.choose_reps(floor_noise, EAGER)
    assert note == "" and 32 < reps < 64
    # ... but a target inside the noise does not interpolate
    reps, note = rs.choose_reps(floor_noise, 0.369)
    assert "not monotone" in note and reps in (0, 8)
    # the bracket of a curve passing the target several times spans all its crossings
    assert rs.bracket(noisy, 0.445) == (32, 59)


def test_the_cuda_aa_kernels_are_vectorised_with_a_scalar_tail_and_an_alignment_check():
    cu = rs.CUDA_CANDIDATE
    assert "float4" in cu and "& 15) == 0" in cu and "i += stride" in cu and "4 * n4 + tid" in cu
    assert "task's own Model" not in rs.aa_candidate("cuda")
