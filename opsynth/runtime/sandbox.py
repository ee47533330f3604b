"""Child processes for untrusted work: one fresh, confined child per job, forked from a warm server.

`run_child(module, job, scratch, timeout_s, cfg)` asks this process's fork server (one per process
and settings, started on first use with a scrubbed environment) for a child that runs
`module.run(job)`. The child is confined by `opsynth.runtime.isolation` (it writes only to its own
scratch folder, sees no network and no other process), gets rlimits, and is killed with everything
it spawned when it outlives `timeout_s`. It writes its verdict to a JSON file; anything it prints
becomes the log. A `build_handler` answers the child's requests to compile extensions: builds run
in the trusted parent's build service, never in the candidate's own process (opsynth.reward.builds).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from opsynth.runtime.device_lock import lock_files
from opsynth.runtime.supervise import kill_group

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_LIMIT = 20_000

# What a child may inherit from the trainer's environment; everything else (HF_TOKEN, cloud keys,
# the user's shell settings) stays behind. Matched by name or prefix.
ENV_ALLOW = {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "TORCH_CUDA_ARCH_LIST", "CC", "CXX", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "PYTORCH_NVCC", "TRITON_PTXAS_PATH", "TORCH_NO_COMPILER_WRAPPER", "OPSYNTH_LIBSECCOMP"}
ENV_ALLOW_PREFIX = ("CUDA_VISIBLE", "NVIDIA_", "CUBLAS_", "CUDNN_", "NCCL_NVLS", "TORCH_SYMM", "NVSHMEM_DISABLE")
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|_KEY$|^AWS_|^HF_|^HUGGING", re.IGNORECASE)


class IsolationUnavailable(RuntimeError):
    """Children cannot be confined here (no namespaces, no libseccomp): the evaluator does not start."""


@dataclass
class ChildResult:
    reason: str  # "ok", "timeout", "crashed", "isolation_failed", or the child's own named reason
    data: dict = field(default_factory=dict)
    log: str = ""
    wall_s: float = 0.0
    server_wait_s: float = 0.0  # before the child: its fork server's start-up, when this call started it


def base_env(extra_path: list[str] = ()) -> dict[str, str]:
    """The environment every child starts from: the allow-list above, never a secret."""
    env = {k: v for k, v in os.environ.items() if (k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIX)) and not SECRET_NAME.search(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if extra_path:
        env["PATH"] = os.pathsep.join([*extra_path, env["PATH"]])
    py_path = [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(py_path))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # Keep freed blocks (up to 32 MiB) in the heap with their contents, so the poison the candidate
    # runner writes into freed memory is what an unwritten output shows (glibc would otherwise unmap it).
    env["MALLOC_MMAP_THRESHOLD_"] = str(32 * 2**20)
    env["MALLOC_TRIM_THRESHOLD_"] = str(2**30)
    return env


def job_env(base: dict, scratch: Path, cpu_threads: int | None, extra: dict | None = None) -> dict:
    """One job's environment: caches and temporary files inside its own scratch folder."""
    env = dict(base)
    env["HOME"] = str(scratch)
    env["TMPDIR"] = str(scratch / "tmp")
    env["TORCH_EXTENSIONS_DIR"] = str(scratch / "torch_extensions")
    env["TRITON_CACHE_DIR"] = str(scratch / "triton")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "inductor")
    env["XDG_CACHE_HOME"] = str(scratch / "cache")
    if cpu_threads:
        env["OMP_NUM_THREADS"] = str(cpu_threads)
    env.update(extra or {})
    return env


# ---- the fork servers of this process -------------------------------------------------------------

_servers: dict[tuple, object] = {}
_servers_lock = threading.Lock()
_starting: dict[tuple, threading.Lock] = {}  # one per server key: a start blocks only its own key's callers
_isolation_checked: dict[str, tuple[bool, str]] = {}


def isolation_enabled(mode: str) -> bool:
    """Resolve `reward.isolation`: namespaces when they work here; refuse to run otherwise.

    `none` runs children unconfined (a warning says so); `auto` and `namespaces` need the probe to
    pass, or raise with one line saying what failed and how to opt out.
    """
    from opsynth.runtime import isolation

    if mode not in isolation.MODES:
        raise ValueError(f"reward.isolation must be one of {isolation.MODES}, got {mode!r}")
    if mode == "none":
        if "warned" not in _isolation_checked:
            _isolation_checked["warned"] = (True, "")
            warnings.warn("reward.isolation=none: candidate children can write to the evaluator's caches and code", stacklevel=2)
        return False
    with _servers_lock:
        if "probe" not in _isolation_checked:
            _isolation_checked["probe"] = isolation.probe()
    ok, why = _isolation_checked["probe"]
    if not ok:
        raise IsolationUnavailable(
            f"cannot sandbox candidate children here ({why}); Linux mount/user namespaces and libseccomp are needed "
            "(see README 'Reward isolation'); set reward.isolation=none to run unconfined"
        )
    return True


def server_env(cfg) -> dict:
    """The environment of the fork servers a config's children come from (its `tool_path`, when it has one)."""
    return base_env(getattr(cfg, "tool_path", None) or [])


def fork_server(env: dict, warm: tuple[str, ...] = (), light: bool = False):
    """This process's fork server for an environment and set of warm modules (the runners its
    children run, imported once), started on first use and restarted if it died. `light`: one
    without Dynamo (`forkserver.LIGHT_MODULES`), for children that only build.
    Servers of different keys start side by side: each key has its own start lock."""
    from opsynth.runtime.forkserver import LIGHT_MODULES, WARM_MODULES, ForkServer

    key = (tuple(sorted(env.items())), tuple(warm), light)
    with _servers_lock:
        start_lock = _starting.setdefault(key, threading.Lock())
    with start_lock:
        with _servers_lock:
            srv = _servers.get(key)
        if srv is None or not srv.alive():
            srv = ForkServer(env, warm=tuple(warm), base=LIGHT_MODULES if light else WARM_MODULES)
            with _servers_lock:
                _servers[key] = srv
        return srv


def shutdown_servers() -> None:
    with _servers_lock:
        for srv in _servers.values():
            srv.close()
        _servers.clear()


def child_ids(shared: bool = False) -> tuple[int, int]:
    """The uid and gid a confined child runs as under root: its own, or the builds' shared one."""
    from opsynth.runtime.privileges import SANDBOX_ID_BASE, SANDBOX_ID_SPAN

    k = 0 if shared else 1 + secrets.randbelow(SANDBOX_ID_SPAN - 1)
    return SANDBOX_ID_BASE + k, SANDBOX_ID_BASE + k


def hand_over(paths: list[str], ids: tuple[int, int], recursive: bool) -> None:
    """Give the child's writable folders to its uid (trusted side, before the child starts).

    `recursive=False` for a shared cache: only entries not already the child's are changed, so a
    large compiler cache is walked once, the first time.
    """
    uid, gid = ids
    for top in paths:
        if not os.path.isdir(top):
            continue
        st = os.lstat(top)
        if not recursive and (st.st_uid, st.st_gid) == ids:
            continue
        for root, dirs, files in os.walk(top):
            for name in [*dirs, *files]:
                try:
                    os.lchown(os.path.join(root, name), uid, gid)
                except FileNotFoundError:
                    pass
        os.lchown(top, uid, gid)


def _serve_builds(sock: socket.socket, handler: Callable[[dict], dict]) -> None:
    """Answer one child's build requests (JSON lines) until it closes its end."""
    f = sock.makefile("rwb")
    try:
        for line in f:
            try:
                reply = handler(json.loads(line))
            except Exception as e:  # a harness error is the child's build error, never ours to raise
                reply = {"ok": False, "error": f"build service error: {type(e).__name__}: {e}"}
            f.write(json.dumps(reply).encode() + b"\n")
            f.flush()
    except (OSError, ValueError):
        pass
    finally:
        try:
            f.close()
            sock.close()
        except OSError:
            pass


def run_child(
    module: str,
    job: dict,
    scratch: Path,
    timeout_s: float,
    cfg,
    stdin_bytes: bytes | None = None,
    build_handler: Callable[[dict], dict] | None = None,
    writable: list[str] = (),
    env_extra: dict | None = None,
    readable: list[str] = (),
    shared_ids: bool = False,
    warm: tuple[str, ...] = (),
    on_start: Callable[[int], None] | None = None,
    channels: dict[str, int] | None = None,
    light: bool = False,
) -> ChildResult:
    """Run `module.run(job)` in a fresh confined child; kill its whole process group on timeout.

    stdin_bytes, when given, is streamed to the child's stdin (read by it when it is ready);
    `writable` adds folders it may write besides its scratch (a build child's compiler cache);
    `readable` adds paths it must read (the extension cache); `warm` names the modules the fork
    server imports before forking (the caller's runners: `module` is one of them). Under root each child runs as a uid
    of its own (`shared_ids`: the one build uid, for children that share a compiler cache).
    `on_start(pid)`, when given, hears the child's pid (its process group) once it runs: the reward
    pauses builds and idle children with it while it times (`opsynth.reward.quiet`).
    `light`: forked from a server without Dynamo (a child that only builds).
    `channels` names descriptors of the caller's that the child gets too (`opsynth.runtime.child.FDS`):
    the reward's outputs channel, a memfd the parent made and reads once the child has ended.
    """
    _check_channels(channels)
    scratch = Path(scratch)
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    job = dict(job, timeout_s=timeout_s)
    job_path = scratch / f"job_{module.rsplit('.', 1)[-1]}_{job.get('mode', 'run')}.json"
    job_path.write_text(json.dumps(job))
    Path(job["result_path"]).unlink(missing_ok=True)
    child = _spawn(module, job_path, scratch, cfg, job.get("cpu_threads", getattr(cfg, "cpu_threads", None)),
                   job.get("device_lock"), writable, env_extra, readable, shared_ids, warm, channels, light,
                   build=build_handler is not None)
    if isinstance(child, ChildResult):
        return child
    return child.finish(Path(job["result_path"]), timeout_s, stdin_bytes, build_handler, on_start)


def _check_channels(channels: dict | None) -> None:
    taken = {"stdin", "log", "build", "go"} & set(channels or {})
    if taken:
        raise ValueError(f"channel names {sorted(taken)} are taken by the sandbox's own descriptors")


class _Spawned:
    """A forked, confined child and the parent's ends of its descriptors, until `finish` waits for it."""

    def __init__(self, srv, job, w_in: int, parent_sock, log_path: Path, server_wait_s: float, go_w: int | None = None):
        self.srv, self.job, self.w_in, self.parent_sock = srv, job, w_in, parent_sock
        self.log_path, self.server_wait_s, self.go_w = log_path, server_wait_s, go_w
        self.t0 = time.perf_counter()

    def finish(self, result_path: Path, timeout_s: float, stdin_bytes: bytes | None, build_handler, on_start) -> ChildResult:
        """Serve the child (its stdin, its build channel), wait for it, read its verdict."""
        srv, child = self.srv, self.job
        if on_start is not None:
            on_start(child.pid)
        if self.parent_sock is not None:
            if build_handler is not None:
                threading.Thread(target=_serve_builds, args=(self.parent_sock, build_handler), daemon=True).start()
            else:
                self.parent_sock.close()
        feeder = threading.Thread(target=_feed, args=(self.w_in, stdin_bytes or b""), daemon=True)
        feeder.start()
        rc = srv.wait(child, timeout_s)
        timed_out = rc is None
        if timed_out:
            kill_group(child.pid)
            rc = srv.wait(child, 30)
        child.close()
        feeder.join(timeout=5)
        wall = time.perf_counter() - self.t0
        log = self.log_path.read_text(errors="replace")[-LOG_LIMIT:]
        sw = self.server_wait_s
        if timed_out:
            return ChildResult("timeout", {}, log + f"\n[sandbox] killed after {timeout_s:.0f} s", wall, sw)
        if rc == 3 and "IsolationError" in log:
            return ChildResult("isolation_failed", {}, log, wall, sw)
        if result_path.exists():
            try:
                data = json.loads(result_path.read_text())
            except json.JSONDecodeError:
                data = {"reason": "crashed"}
            if not isinstance(data, dict):
                data = {"reason": "crashed"}
            return ChildResult(str(data.get("reason", "crashed")), data, log, wall, sw)
        how = f"signal {-rc}" if rc is not None and rc < 0 else f"exit code {rc}"
        return ChildResult("crashed", {}, log + f"\n[sandbox] child ended with {how} and no verdict", wall, sw)

    def close(self) -> None:
        """Kill a child that will not be finished (a parked one never used): the server kills it when
        its connection closes."""
        for fd in (self.w_in, self.go_w):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.w_in = self.go_w = None
        if self.parent_sock is not None:
            self.parent_sock.close()
        self.job.close()


def _spawn(module: str, job_path: Path, scratch: Path, cfg, cpu_threads, device_lock, writable, env_extra, readable,
           shared_ids: bool, warm, channels: dict | None, light: bool, build: bool, park: dict | None = None):
    """Fork one confined child from the fork server; a `ChildResult` (crashed) when it cannot start.
    `park`: the child prepares (`module.prewarm(park)`) and then waits for a byte on its go pipe
    before it reads its job (`ParkedChild`)."""
    from opsynth.runtime import isolation

    isolated = isolation_enabled(getattr(cfg, "isolation", "auto"))
    base = server_env(cfg)
    t_server = time.perf_counter()
    srv = fork_server(base, tuple(warm), light)
    server_wait_s = round(time.perf_counter() - t_server, 3)
    env = job_env(base, scratch, cpu_threads, env_extra)
    cache_dir = cfg.resolved_cache_dir()
    ids = None
    if isolated and os.getuid() == 0:
        ids = child_ids(shared_ids)
        env.update(USER="opsynth-sandbox", LOGNAME="opsynth-sandbox")
        hand_over([str(scratch)], ids, recursive=True)
        hand_over([str(w) for w in writable], ids, recursive=False)
    req = {
        "module": module,
        "job_path": str(job_path),
        "cwd": str(scratch),
        "env": env,
        "isolation": {
            "enabled": isolated,
            "writable": [str(scratch), *map(str, writable)],
            "hidden": [str(cache_dir / "trust")] if (cache_dir / "trust").is_dir() else [],
            "must_not_write": [str(cache_dir), str(REPO_ROOT), str(Path(sys.prefix))],
            "readable": isolation.readable_paths([str(cache_dir / "ext"), str(cache_dir / "bin"), *map(str, readable),
                                                  *lock_files(device_lock)]),
            "ids": ids,
            "syscall_filter": getattr(cfg, "syscall_filter", True),
            # The caller's home and temporary folders, named here: the child's environment is its job's
            "private": isolation.private_folders(switched=ids is not None),
        },
    }
    if park is not None:
        req["park"] = park
    log_path = job_path.with_suffix(".log")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    r_in, w_in = os.pipe()
    fds = {"stdin": r_in, "log": log_fd, **(channels or {})}  # channels: sent as copies, the caller's stay its own
    go_r = go_w = None
    if park is not None:
        go_r, go_w = os.pipe()
        fds["go"] = go_r
    parent_sock = child_sock = None
    if build:
        parent_sock, child_sock = socket.socketpair()
        fds["build"] = child_sock.fileno()
    t0 = time.perf_counter()
    try:
        child = srv.spawn(req, fds)
    except Exception as e:
        for fd in (r_in, w_in, log_fd, go_r, go_w):
            if fd is not None:
                os.close(fd)
        if parent_sock is not None:
            parent_sock.close()
            child_sock.close()
        return ChildResult("crashed", {}, f"[sandbox] could not start the child: {e}", 0.0, server_wait_s)
    for fd in (r_in, log_fd, go_r):
        if fd is not None:
            os.close(fd)
    if child_sock is not None:
        child_sock.close()
    spawned = _Spawned(srv, child, w_in, parent_sock, log_path, server_wait_s, go_w)
    spawned.t0 = t0
    return spawned


class ParkedChild:
    """A confined child forked before its job exists: it has done what every job of its kind needs
    (fork, confinement, `module.prewarm(prewarm)`: a CUDA context, for the reward's measuring child)
    and waits for exactly one job; `run` hands it over and waits like `run_child`. It never runs a
    second job: a child that ran one candidate is never trusted with another.

    Its scratch folder is fixed when it is forked (the confinement binds it): the caller writes the
    job's files there (`scratch`) before `run`, and the `channels` it was given are its job's; so is
    `device_lock`, the lock file its job will take (the reference child's), readable inside."""

    def __init__(self, module: str, scratch: Path, cfg, *, cpu_threads=None, env_extra: dict | None = None,
                 writable=(), readable=(), shared_ids: bool = False, warm=(), light: bool = False,
                 channels: dict[str, int] | None = None, build: bool = False, prewarm: dict | None = None,
                 device_lock: str | None = None):
        _check_channels(channels)
        self.module, self.scratch = module, Path(scratch)
        (self.scratch / "tmp").mkdir(parents=True, exist_ok=True)
        self.job_path = self.scratch / f"job_{module.rsplit('.', 1)[-1]}_parked.json"
        self._ids = None
        spawned = _spawn(module, self.job_path, self.scratch, cfg, cpu_threads, device_lock, writable, env_extra, readable,
                         shared_ids, warm, channels, light, build, park=dict(prewarm or {}))
        if isinstance(spawned, ChildResult):
            raise RuntimeError(spawned.log)
        self._spawned = spawned
        self.pid = spawned.job.pid
        self.used = False

    def alive(self) -> bool:
        """False once the child has ended (its exit code waits on the connection) or was used."""
        if self.used or self._spawned.go_w is None:
            return False
        import select

        readable, _, _ = select.select([self._spawned.job.sock], [], [], 0)
        return not readable

    def run(self, job: dict, timeout_s: float, stdin_bytes: bytes | None = None,
            build_handler: Callable[[dict], dict] | None = None, on_start: Callable[[int], None] | None = None) -> ChildResult:
        """Give the child its one job (written to its scratch, handed to its uid) and wait for it."""
        if self.used:
            raise RuntimeError("a parked child runs exactly one job")
        self.used = True
        sp = self._spawned
        job = dict(job, timeout_s=timeout_s)
        result_path = Path(job["result_path"])
        result_path.unlink(missing_ok=True)
        self.job_path.write_text(json.dumps(job))
        st = os.stat(self.scratch)
        if os.getuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):  # what the parent wrote since the fork: the child's
            hand_over([str(self.scratch)], (st.st_uid, st.st_gid), recursive=True)
        sp.t0 = time.perf_counter()
        try:
            os.write(sp.go_w, b"g")
        except OSError:
            pass  # it died while parked: finish reports how
        os.close(sp.go_w)
        sp.go_w = None
        return sp.finish(result_path, timeout_s, stdin_bytes, build_handler, on_start)

    def close(self) -> None:
        """Kill it if it was never used."""
        if not self.used:
            self.used = True
            self._spawned.close()


def _feed(fd: int, data: bytes) -> None:
    try:
        with os.fdopen(fd, "wb") as f:
            if data:
                f.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass  # the child died or stopped reading; its verdict says why


# The child side (limits, the device lock, the job entry) is opsynth.runtime.child: the fork server's
# children import it, and it imports nothing of this module.
