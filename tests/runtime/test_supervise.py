"""stop_tree: a quiet window may start timing the moment stop_tree returns, so by then every process
of the tree must be stopped, not merely signalled."""

import subprocess
import sys

from opsynth.runtime.supervise import continue_pids, process_state, stop_tree

SPIN = "import os, sys\nfor _ in range(2):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass\n"


def test_every_process_of_a_spinning_tree_reads_stopped_when_stop_tree_returns():
    proc = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        for _ in range(40):
            pids = stop_tree(proc.pid)
            assert proc.pid in pids
            states = {p: process_state(p) for p in pids}
            assert all(s in ("T", "t") for s in states.values()), states
            continue_pids(pids)
        assert len(pids) >= 3  # the parent and its spinning children
        assert process_state(proc.pid) in ("R", "S")  # continued
        # Control: without the wait, a signalled spinner is often still running (48 of 200 here).
        late = 0
        for _ in range(200):
            pids = stop_tree(proc.pid, settle_s=0)
            late += any(process_state(p) not in ("T", "t") for p in pids)
            continue_pids(pids)
        assert late > 0
    finally:
        pids = stop_tree(proc.pid, settle_s=0.1)
        for p in pids:
            subprocess.run(["kill", "-9", str(p)], check=False)
        proc.wait(10)


def test_process_state_of_a_gone_process_is_none():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    assert process_state(proc.pid) is None
