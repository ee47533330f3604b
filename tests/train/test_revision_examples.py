"""The second turns the smoke policy is warm-started on: what a multi-turn episode will show it."""

import re

from opsynth.train.warm_start import revision_examples

ANSWER = "```python\nimport torch\nx = 1\ny = 2\n```"


def test_each_program_comes_back_after_slow_verdicts_with_fresh_numbers_and_after_a_rejection():
    out = revision_examples([("P", ANSWER)], seed=3, timings=6)
    assert len(out) == 7
    slow, bad = out[:6], out[6]
    assert all(first == ANSWER and answer == ANSWER for _, first, _, answer in slow)
    assert all("correct, but not more than" in fb for _, _, fb, _ in slow)
    # Six different timings, worded as the reward words them (at most 4 significant digits).
    times = [tuple(re.findall(r"([0-9.]+) ms", fb)) for _, _, fb, _ in slow]
    assert len(set(times)) == 6
    assert all(len(re.sub(r"^0\.0*|\.", "", t)) <= 4 for ts in times for t in ts)
    # The rejection: the program with one of its own lines dropped, then the program.
    _, broken, fb, answer = bad
    assert answer == ANSWER and "syntax_error" in fb
    assert len(broken.splitlines()) == len(ANSWER.splitlines()) - 1 and broken.startswith("```python\n")


def test_the_same_seed_gives_the_same_examples():
    assert revision_examples([("P", ANSWER)], seed=1) == revision_examples([("P", ANSWER)], seed=1)
    assert revision_examples([("P", ANSWER)], seed=1) != revision_examples([("P", ANSWER)], seed=2)
