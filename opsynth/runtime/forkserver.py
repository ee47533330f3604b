"""A warm fork server: one process per node that has imported torch and the runners (no CUDA
initialised) and forks one fresh child per job.

Why: a child started with `python -m ...` paid 5-25 s of torch import and module loading before
doing anything (measured on the H200 under load); a fork of a process that already holds them
starts in milliseconds. Every job still gets its own process, confined by `isolation.enter`, with
the same rlimits and timeouts as before, and a candidate never shares a process with another
candidate or with the trainer.

Protocol (one Unix-socket connection per job, on an abstract address, so no file on disk names it
and a sandboxed child, in its own network namespace, cannot reach it): the client sends one JSON
request with the job's file descriptors (stdin, log, optionally a build channel) as SCM_RIGHTS; the
server forks, answers `{"pid": ...}`, and later `{"exit": code}` when the child has ended. If the
client hangs up first, the child's process group is killed. The server exits when its stdin (a pipe
from the client) closes, so it never outlives the process that started it.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

# Imported here, before any fork, so every child starts with them loaded (no CUDA is initialised).
# Not torch.utils.cpp_extension: importing it marks later forks unable to use CUDA (seen with torch
# 2.11 on the H200: "Cannot re-initialize CUDA in forked subprocess"); children import it themselves.
# torch._dynamo too: a child's first operator under a Python dispatch mode (the reward's op audit)
# imports it through torch._compile (seen: 4.6 s of every candidate child's 5 s set-up on CPU).
WARM_MODULES = ("torch", "torch.nn.functional", "torch.profiler", "torch._dynamo")  # and each caller's runners (`warm`)
# A light server's: children that only build (a candidate's module run for its load_inline calls, the
# compilers' child) never run an operator under the audit's dispatch mode, so never need Dynamo (and
# the runners that time). Without them a server starts in about half the time (3.1 -> 1.7 s on a
# 2-core CPU), and a cold first evaluation waits for its build's server first.
LIGHT_MODULES = ("torch",)

MAX_MSG = 1 << 16
MAX_FDS = 8  # a job's descriptors: stdin, log and its named channels


def _send(conn: socket.socket, obj: dict, fds: list[int] = ()) -> None:
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(conn, [data + b"\n"], list(fds))
    else:
        conn.sendall(data + b"\n")


def _recv_line(conn: socket.socket, buf: bytearray) -> dict | None:
    while b"\n" not in buf:
        chunk = conn.recv(MAX_MSG)
        if not chunk:
            return None
        buf.extend(chunk)
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line)


# ---- server -------------------------------------------------------------------------------------


def _child(req: dict, fds: dict[str, int]) -> None:  # pragma: no cover - runs in the forked child
    """In the fork: take the job's fds, confine, run the runner, never return."""
    code = 1
    try:
        os.setsid()  # its own process group: a timeout kills whatever it spawned too
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(fds["stdin"], 0)
        os.dup2(fds["log"], 1)
        os.dup2(fds["log"], 2)
        for fd in (fds["stdin"], fds["log"]):
            os.close(fd)
        # Nothing the server holds open (its pipes, imported libraries' files) reaches the job: only
        # its named channels (a build channel, an outputs channel), by the numbers they arrived as.
        extra = {k: v for k, v in fds.items() if k not in ("stdin", "log")}
        keep = sorted({0, 1, 2, *extra.values()})
        lo = 3
        for fd in keep:
            if fd >= lo:
                os.closerange(lo, fd)
                lo = fd + 1
        os.closerange(lo, 65536)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import tempfile

        tempfile.tempdir = None  # the server's cached /tmp: recompute from this job's TMPDIR (its scratch)
        iso = req.get("isolation") or {}
        if iso.get("enabled"):
            from opsynth.runtime import isolation

            isolation.enter(
                iso["writable"], iso.get("hidden", []), iso.get("must_not_write", []), iso.get("readable", []),
                tuple(iso["ids"]) if iso.get("ids") else None, iso.get("syscall_filter", True), iso.get("private"),
            )
            os.chdir(req["cwd"])  # again: the old working folder is the one from before its writable bind
        from opsynth.runtime.child import park, run_job

        if "park" in req:  # forked ahead of its job (sandbox.ParkedChild): prepare, then wait for it
            park(req["module"], extra.pop("go"), req["park"])
        run_job(req["module"], req["job_path"], fds=extra)
        code = 0
    except BaseException as e:  # noqa: BLE001 - report and die; the parent names the reason
        try:
            print(f"[sandbox] child could not start: {type(e).__name__}: {e}", flush=True)
        except Exception:
            pass
        code = 3 if type(e).__name__ == "IsolationError" else 1
    os._exit(code)


def _forks_lose_cuda() -> bool:
    """True when torch would refuse CUDA in a fork of this process (something initialised it here)."""
    import torch

    check = getattr(torch._C, "_cuda_isInBadFork", None)
    if check is None:
        return False
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the probe child
        os._exit(1 if check() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def serve(name: str, warm: tuple[str, ...] = WARM_MODULES) -> None:  # pragma: no cover - exercised through ForkServer
    import importlib

    from opsynth.runtime.supervise import kill_group

    for m in warm:
        importlib.import_module(m)
    from opsynth.runtime import syscall_filter

    syscall_filter.available()  # libseccomp loaded once here, not in every child
    threads = threading.active_count()
    if _forks_lose_cuda():
        print(json.dumps({"ready": False, "error": "an import marked forks unable to use CUDA"}), flush=True)
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(256)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    by_pid: dict[int, socket.socket] = {}
    by_conn: dict[socket.socket, int] = {}
    print(json.dumps({"ready": True, "pid": os.getpid(), "threads": threads}), flush=True)

    def reap() -> None:
        while by_pid:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = by_pid.pop(pid, None)
            if conn is not None:
                by_conn.pop(conn, None)
                try:
                    _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                except OSError:
                    pass
                try:
                    sel.unregister(conn)
                except (KeyError, ValueError):
                    pass
                conn.close()

    def shutdown(*_a) -> None:
        for pid in list(by_pid):
            kill_group(pid)
        os._exit(0)

    signal.signal(signal.SIGTERM, shutdown)
    while True:
        for key, _ in sel.select(timeout=0.02):
            if key.data == "stdin":
                if not os.read(sys.stdin.fileno(), 4096):
                    shutdown()
            elif key.data == "accept":
                conn, _ = listener.accept()
                try:
                    msg, fds, _flags, _addr = socket.recv_fds(conn, MAX_MSG, MAX_FDS)
                    req = json.loads(msg.decode().strip())
                    named = dict(zip(req.pop("fd_names"), fds))
                except (OSError, ValueError, KeyError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for c in list(by_conn):
                        c.close()
                    conn.close()
                    _child(req, named)
                for fd in fds:
                    os.close(fd)
                by_pid[pid] = conn
                by_conn[conn] = pid
                sel.register(conn, selectors.EVENT_READ, "conn")
                _send(conn, {"pid": pid})
            else:  # the client hung up (or sent something): kill its child
                conn = key.fileobj
                try:
                    data = conn.recv(16)
                except OSError:
                    data = b""
                if not data:
                    pid = by_conn.pop(conn, None)
                    sel.unregister(conn)
                    conn.close()
                    if pid is not None:
                        by_pid.pop(pid, None)
                        kill_group(pid)
                        try:
                            os.waitpid(pid, 0)
                        except ChildProcessError:
                            pass
        reap()


# ---- client -------------------------------------------------------------------------------------


class ForkServerError(RuntimeError):
    pass


class Job:
    """A running child's connection to the server: its pid, and where its exit code will arrive."""

    def __init__(self, sock: socket.socket, pid: int, buf: bytearray):
        self.sock, self.pid, self.buf = sock, pid, buf

    def close(self) -> None:
        self.sock.close()


class ForkServer:
    """Client side: starts the server process (with a scrubbed environment) and runs jobs on it."""

    def __init__(self, env: dict[str, str], python: str = sys.executable, start_timeout_s: float = 300.0,
                 warm: tuple[str, ...] = (), base: tuple[str, ...] = WARM_MODULES):
        self.name = f"opsynth-forkserver-{os.getpid()}-{secrets.token_hex(8)}"
        t0 = time.perf_counter()
        # Its stderr goes to a file, not a pipe: a pipe nobody reads would fill up (warnings) and stall it.
        import tempfile

        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [python, "-m", "opsynth.runtime.forkserver", self.name, ",".join((*base, *warm))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            cwd="/",
            start_new_session=True,
        )
        line = self._wait_ready(start_timeout_s)
        self.start_s = time.perf_counter() - t0
        self.info = json.loads(line)
        if not self.info.get("ready"):
            self.proc.kill()
            raise ForkServerError(f"the reward fork server cannot serve: {self.info.get('error')}")

    def _wait_ready(self, timeout_s: float) -> str:
        out: list[bytes] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout_s)
        if not out or not out[0].strip():
            self.proc.kill()
            self.log.seek(0)
            err = self.log.read().decode(errors="replace")[-3000:]
            raise ForkServerError(f"the reward fork server did not start within {timeout_s:.0f} s: {err}")
        return out[0].decode()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, req: dict, fds: dict[str, int]) -> Job:
        """Ask for one child. Closing the returned job's connection kills the child."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect("\0" + self.name)
            names = list(fds)
            _send(conn, {**req, "fd_names": names}, [fds[n] for n in names])
            buf = bytearray()
            msg = _recv_line(conn, buf)
        except OSError as e:
            conn.close()
            raise ForkServerError(f"fork server unreachable: {e}") from None
        if not msg or "pid" not in msg:
            conn.close()
            raise ForkServerError("fork server did not start the child")
        return Job(conn, int(msg["pid"]), buf)

    @staticmethod
    def wait(job: Job, timeout_s: float) -> int | None:
        """The child's exit code, or None if it is still running after timeout_s."""
        job.sock.settimeout(max(0.01, timeout_s))
        try:
            msg = _recv_line(job.sock, job.buf)
        except socket.timeout:
            return None
        except OSError:
            return -1
        return -1 if msg is None else int(msg.get("exit", -1))

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


if __name__ == "__main__":  # pragma: no cover
    serve(sys.argv[1], tuple(m for m in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if m))
