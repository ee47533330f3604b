"""One lock per physical GPU, shared by the verifier and the reward environment."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

from opsynth.runtime.timing import device_lock_path, file_lock, gpu_key


def test_two_device_indices_never_share_a_lock_file(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert device_lock_path("cuda", 0, str(tmp_path)) != device_lock_path("cuda", 1, str(tmp_path))
    assert device_lock_path("cpu", 0, str(tmp_path)) not in (device_lock_path("cuda", 0, str(tmp_path)),)


def test_the_lock_follows_the_physical_gpu_not_the_visible_index(monkeypatch, tmp_path):
    # Two ranks pinned by CUDA_VISIBLE_DEVICES both call their GPU "index 0": their locks still differ.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    rank0 = device_lock_path("cuda", 0, str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    rank1 = device_lock_path("cuda", 0, str(tmp_path))
    assert rank0 != rank1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,3")
    assert device_lock_path("cuda", 1, str(tmp_path)) == rank0  # the same physical GPU, the same lock
    assert gpu_key(0) == "5"


def test_holding_one_gpus_lock_does_not_block_another(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    a, b = device_lock_path("cuda", 0, str(tmp_path)), device_lock_path("cuda", 1, str(tmp_path))
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
        "except BlockingIOError:\n    print('held')\n"
    )
    with file_lock(a):
        other = subprocess.run([sys.executable, "-c", probe, b], capture_output=True, text=True).stdout.strip()
        same = subprocess.run([sys.executable, "-c", probe, a], capture_output=True, text=True).stdout.strip()
    assert other == "free" and same == "held"
    fd = os.open(a, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on exit of the context
    os.close(fd)
