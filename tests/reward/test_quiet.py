"""Quiet windows count how long they kept a build stopped: a cold build's wall is its compilers'
time plus this, and the reward's timeline reports the two apart."""

import subprocess
import sys
import time

import psutil

from opsynth.reward import quiet


def test_a_window_stops_a_tracked_child_and_reports_how_long():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with quiet.tracked("build") as on_start:
            on_start(proc.pid)
            with quiet.window():
                assert psutil.Process(proc.pid).status() == "stopped"
                time.sleep(0.4)
            assert psutil.Process(proc.pid).status() != "stopped"
            time.sleep(0.3)  # running again: not counted
        assert 0.4 <= on_start.paused_s < 0.65, on_start.paused_s
        assert proc.pid not in quiet.registered()
    finally:
        proc.kill()
        proc.wait()


def test_a_child_that_ran_outside_every_window_was_paused_zero_seconds():
    """Let run inside the window (a baseline child timing its own block), it is not charged for the
    window's 0.6 s: only the moments around `running` (a /proc listing each; 61 ms seen in CI under
    load, where the bound was 50 ms) when the window stopped it before and after."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with quiet.tracked("build") as on_start:
            on_start(proc.pid)
            with quiet.window(), quiet.running(proc.pid):
                assert psutil.Process(proc.pid).status() != "stopped"
                time.sleep(0.6)
        assert on_start.paused_s < 0.3, on_start.paused_s
    finally:
        proc.kill()
        proc.wait()
