"""Where one timed round's harness time goes (issue 28: the reward at RL scale).

On the H200 a timed round took about 5.8 ms of which about 1.8 ms was the timed call: the rest is
the harness around it (opsynth.reward.rounds.run_rounds: fresh inputs, three channel round trips,
the outputs' fingerprints and the inputs' hash, poisoning the outputs), all of it under the device
lock. This benchmark breaks one round into those parts on a few task shapes and times each (median
over many rounds), drives the real `run_rounds` against a real `RoundSession` served on a socketpair
(what the parent's clocks see per round), and counts per part:

- host reads (`int`, `bool`, `float`, `.item`, `.tolist`, `.cpu` on a tensor, seen by a
  TorchFunctionMode): on CUDA each is a device sync (on the CPU, counted on the path a device
  takes: timed_inputs reads a CPU's values at once, `_READ_NOW`);
- aten ops that reach a kernel (a TorchDispatchMode; views left out): about one launch each;
- on CUDA, the syncs `torch.cuda.set_sync_debug_mode("warn")` reports and the kernels (and
  memcpy/memset) the profiler sees.

Each part is timed with a device sync before and after it (its device work included). The channel
parts are real round trips to a `RoundSession` answering in a thread (`rtt_*`), the child's
`Channel` as the harness uses it.

    python benchmarks/round_overhead.py --device cpu
    python benchmarks/round_overhead.py --device cuda          # on the H200: about a minute

Writes JSON (`--out`, default benchmarks/results/round_overhead_<device>.json) after every task,
so a run cut short still leaves what it measured. Imports only torch and opsynth.reward.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import socket
import statistics
import struct
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from opsynth.reward import timed_inputs  # noqa: E402
from opsynth.reward.compare import as_output_list  # noqa: E402
from opsynth.reward.guards import poison_fill  # noqa: E402
from opsynth.reward.rounds import Channel, RoundSession, TimingPlan, run_rounds, session_handler  # noqa: E402
from opsynth.runtime.sandbox import _serve_builds  # noqa: E402
from opsynth.runtime.timing import Timer  # noqa: E402

TRIALS = 5  # trial input sets the fresh inputs are drawn from (the reward's default)

try:  # the harness functions as they were before issue 28's cuts, timed beside the current ones
    sys.path.insert(0, str(REPO / "tests" / "reward"))
    import legacy_timed_inputs as legacy  # noqa: E402
except ImportError:  # pragma: no cover
    legacy = None


# ---- tasks ---------------------------------------------------------------------------------------


def _tasks(device: str) -> dict:
    """name -> (forward, input shapes and dtypes). Sizes a little larger on CUDA, where the harness's
    cost is mostly per launch and per sync, not per element."""
    big = device == "cuda"
    n = 4096 if big else 512
    return {
        # one float output: the most common task
        "elementwise": (lambda x: x * 2.0 + 1.0, [((n, 1024), torch.float32)]),
        # four outputs of three floating dtypes, one a reduction
        "multi_output": (lambda x, y: (x + y, (x * y).half(), (x - y).to(torch.bfloat16), x.sum(-1)),
                         [((n, 1024), torch.float32), ((n, 1024), torch.float32)]),
        # an integer and a bool output beside a float one, an int64 input
        "int_output": (lambda x, i: (x.argmax(-1), x > 0, x * 2.0 + i.to(x.dtype)),
                       [((n, 1024), torch.float32), ((n, 1024), torch.int64)]),
        # one input and one output of over two chunks (timed_inputs._CHUNK elements per chunk)
        "chunked": (lambda x: x * 0.5 - 1.0, [((9 * 2**20,), torch.float32)]),
    }


def _trials(specs, device: str) -> list:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(TRIALS):
        t = []
        for shape, dtype in specs:
            if dtype.is_floating_point:
                t.append(torch.randn(*shape, generator=g).to(dtype).to(device))
            else:
                t.append(torch.randint(0, 7, shape, generator=g, dtype=dtype).to(device))
        out.append(t)
    return out


# ---- counters ------------------------------------------------------------------------------------

_HOST_READS = {"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy"}


class HostReads(TorchFunctionMode):
    """Counts reads of a tensor's values on the host (a device sync each on CUDA); reads of what a
    `.cpu()` brought over (by storage) are not counted again: that copy was the read."""

    def __init__(self):
        super().__init__()
        self.n = 0
        self.copied: set = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        read = name in _HOST_READS
        if name == "to" and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu":
            dev = kwargs.get("device", args[1] if len(args) > 1 else None)
            read = isinstance(dev, (str, torch.device)) and torch.device(dev).type == "cpu"
        if read and args and isinstance(args[0], torch.Tensor):
            if args[0].untyped_storage().data_ptr() not in self.copied:
                self.n += 1
            if isinstance(out, torch.Tensor):
                self.copied.add(out.untyped_storage().data_ptr())
        return out


class AtenOps(TorchDispatchMode):
    """Counts aten ops that run a kernel (views and metadata left out): about one launch each."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not (torch.Tag.view_copy in func.tags or func.is_view or "alias" in func.__name__):
            self.n += 1
        return func(*args, **(kwargs or {}))


# ---- the parent's side: a RoundSession answered in another process, as sandbox.run_child serves it ---


_STATE = ("asked", "started", "ready", "claims", "call_wall", "returned", "before", "after", "settle", "wall", "error", "done")


def _recv_exact(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _server_main(ctl) -> None:
    """The server process: for each (plan, socket) it is handed, a RoundSession answered on that
    socket by the evaluator's channel loop until the child's end closes; then what it clocked."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 1)
        except OSError:
            return
        if not msg or not fds:
            return
        session = RoundSession(TimingPlan(**json.loads(msg)))
        _serve_builds(socket.socket(fileno=fds[0]), session_handler(session, None))
        state = pickle.dumps({k: getattr(session, k) for k in _STATE})
        ctl.sendall(struct.pack("<Q", len(state)) + state)


class SessionServer:
    """A process forked at the start, before this one touches a GPU (a child forked from a CUDA
    process must not touch it; this one never could), that plays the evaluator's side of each
    session's channel."""

    def __init__(self):
        self.ctl, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the server
            try:
                self.ctl.close()
                _server_main(theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.pid = pid

    def close(self):
        self.ctl.close()
        os.waitpid(self.pid, 0)


SERVER: SessionServer | None = None


class Served:
    """One session: a RoundSession on the server's side of a socketpair; `chan` is the child's end,
    `session()` what the parent clocked (once the child's end is closed)."""

    def __init__(self, rounds: int):
        self.plan = TimingPlan.draw(0, rounds, 1e-2, 1e-2)
        parent, self.child = socket.socketpair()
        socket.send_fds(SERVER.ctl, [json.dumps(self.plan.to_dict()).encode()], [parent.fileno()])
        parent.close()  # the server holds its own copy
        self.chan = Channel(self.child.fileno())
        self._state = None

    def close(self):
        """The child's end closed, and what the server's session clocked read back (always: the
        next session's report must not meet this one's)."""
        if self._state is not None:
            return
        self.child.close()
        SERVER.ctl.settimeout(60)
        try:
            (n,) = struct.unpack("<Q", _recv_exact(SERVER.ctl, 8))
            self._state = pickle.loads(_recv_exact(SERVER.ctl, n))
        finally:
            SERVER.ctl.settimeout(None)

    def session(self) -> RoundSession:
        self.close()
        s = RoundSession(self.plan)
        for k, v in self._state.items():
            setattr(s, k, v)
        return s


# ---- measuring ------------------------------------------------------------------------------------


def _median(xs):
    return round(statistics.median(xs), 4) if xs else None


def _read_syscalls() -> int | None:
    """This process's read system calls so far (/proc/self/io `syscr`), or None where not kept."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("syscr:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Part:
    def __init__(self, sync):
        self.sync = sync
        self.ms: dict[str, list] = {}
        self.reads: dict[str, list] = {}  # read system calls of the channel parts

    def __call__(self, name, fn, *a):
        self.sync()
        r0 = _read_syscalls() if name.startswith("rtt_") else None
        t0 = time.perf_counter()
        r = fn(*a)
        self.sync()
        self.ms.setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
        if r0 is not None:
            r1 = _read_syscalls()
            self.reads.setdefault(name, []).append(r1 - r0 - 1)  # less the read of /proc/self/io itself
        return r


def _report_fn():
    """The one-transfer fingerprints-and-key of the harness when it has one (None before it did)."""
    return getattr(timed_inputs, "fingerprints_and_key", None)


def parts_loop(fn, buffers, stacked, timer, rounds: int, sync) -> dict:
    """Round by round as run_rounds makes them, each part timed alone; the channel messages go to a
    real RoundSession. Fingerprints and the input hash are timed each alone and, where the harness
    computes them together, together (`report`: what a round now runs)."""
    served = Served(rounds)
    chan = served.chan
    part = Part(sync)
    both = _report_fn()
    settle, claim = [], []
    mismatches = []
    res_bytes = {}
    old_chan = legacy.Channel(served.child.fileno()) if legacy is not None else None
    try:
        seed = part("rtt_round_start", chan.request, {"kind": "round_start", "j": 0})["seed"]
        for j in range(rounds):
            part("fresh_inputs", timed_inputs.fresh_inputs, buffers, stacked, int(seed))
            part("rtt_round_ready", chan.request, {"kind": "round_ready", "j": j})
            ms, out = part("call_timed", timer.time_call, fn, buffers)
            claim.append(ms)
            settle.append(timer.settled[0])
            part("rtt_round_returned", chan.request, {"kind": "round_returned", "j": j, "ms": float(ms),
                                                      "settle_ms": float(timer.settled[0])})
            outs = as_output_list(out)

            def current():
                fp = part("fingerprint", timed_inputs.fingerprint, outs)
                key = part("input_key", timed_inputs.input_key, buffers)
                if both is not None:
                    fp2, key2 = part("report", both, outs, buffers)
                    if fp2 != fp or key2 != key:
                        mismatches.append(("report", j))
                return fp, key

            def old():  # the same values as before the cuts, on this device
                return (part("legacy_fingerprint", legacy.fingerprint, outs),
                        part("legacy_input_key", legacy.input_key, buffers))

            # in turn first and second: the first after the call meets its outputs colder in the caches
            if legacy is not None and j % 2:
                old_fp, old_key = old()
                fp, key = current()
            else:
                fp, key = current()
                old_fp, old_key = old() if legacy is not None else (fp, key)
            if old_fp != fp or old_key != key or [list(map(type, f)) for f in fp] != [list(map(type, f)) for f in old_fp]:
                mismatches.append(("legacy", j))
            rep = part("rtt_round_done", chan.request, {"kind": "round_done", "j": j, "fp": fp, "key": key})
            part("rtt_noop", chan.request, {"kind": "timing_share"})  # a bare round trip (no pacer: just ok)
            if old_chan is not None:
                part("rtt_noop_legacy", old_chan.request, {"kind": "timing_share"})
            seed = rep.get("seed")
            if j == 0:  # the old channel read a reply a byte per system call
                res_bytes = {"round_ready": 13, "round_returned": 13, "round_done": len(json.dumps(rep)) + 1}
            if j % 5 == 0:  # 2 rounds a pass only (and a large copy on CUDA)
                part("keep_cpu_copy", lambda: [o.detach().cpu().clone() for o in outs])
            part("poison", lambda: [poison_fill(o) for o in outs])
            out = outs = None
    finally:
        served.close()
    if served.session().error:
        raise RuntimeError(f"protocol error: {served.session().error}")
    res = {k: _median(v) for k, v in part.ms.items()}
    res["read_syscalls"] = {k: _median(v) for k, v in part.reads.items()}
    res["reply_bytes"] = res_bytes  # a round's replies: the read system calls the byte-wise channel made
    res["claim"] = _median(claim)
    res["settle"] = _median(settle)
    res["fp_and_key"] = res["report"] if both is not None else round(res["fingerprint"] + res["input_key"], 4)
    if legacy is not None:
        res["legacy_fp_and_key"] = round(res["legacy_fingerprint"] + res["legacy_input_key"], 4)
        res["legacy_mismatch_rounds"] = mismatches
        if mismatches:
            print(f"[round_overhead] MISMATCH: fingerprints or input keys differ from the legacy functions in rounds {mismatches[:10]}",
                  flush=True)
    return res


def session_loop(fn, buffers, stacked, timer, rounds: int) -> dict:
    """The real run_rounds (the reference's hooks: poison after the report) against a real
    RoundSession: per round, the parent's ms from the seed to `ready` (inputs made), around the call
    beyond its claim, from `returned` to the report, the whole round beyond its claim, and from one
    seed request to the next (what a round costs the device lock)."""
    served = Served(rounds)

    def poison(outs):
        for o in outs:
            poison_fill(o)

    try:
        t0 = time.perf_counter()
        run_rounds(fn, buffers, stacked, timer, served.chan, 0, after_report=poison)
        served.chan.request({"kind": "timing_done"})
        total = time.perf_counter() - t0
    finally:
        served.close()
    s = served.session()
    skip = min(3, rounds // 4)  # the first rounds make the fingerprints' weights
    rs = [j for j in sorted(s.wall) if j >= skip]
    return {
        "rounds": len(s.wall),
        "claim_ms": _median([s.claims[j] for j in rs]),
        "before_ms": _median([s.before[j] for j in rs]),
        "call_beyond_claim_ms": _median([s.call_wall[j] - s.claims[j] for j in rs]),
        "after_ms": _median([s.after[j] for j in rs]),
        "settle_ms": _median([s.settle[j] for j in rs]),
        "round_ms": _median([s.wall[j] for j in rs]),
        "round_beyond_claim_ms": _median([s.wall[j] - s.claims[j] for j in rs]),
        "period_ms": _median(s.periods()[skip:]),
        "pass_s": round(total, 3),
        "protocol_error": s.error,
    }


def _round_parts(fn, buffers, stacked, timer, seed):
    """One round's harness work (no channel), part by part, for the counters."""
    both = _report_fn()
    yield "fresh_inputs", lambda: timed_inputs.fresh_inputs(buffers, stacked, seed)
    box = {}

    def call():
        box["outs"] = as_output_list(timer.time_call(fn, buffers)[1])

    yield "call_timed", call
    outs = box["outs"]
    yield "fingerprint", lambda: timed_inputs.fingerprint(outs)
    yield "input_key", lambda: timed_inputs.input_key(buffers)
    if both is not None:
        yield "report", lambda: both(outs, buffers)
    if legacy is not None:
        yield "legacy_fingerprint", lambda: legacy.fingerprint(outs)
        yield "legacy_input_key", lambda: legacy.input_key(buffers)
    yield "poison", lambda: [poison_fill(o) for o in outs]


def count_loop(fn, buffers, stacked, timer, rounds: int, cuda: bool) -> dict:
    """Per part and round: host reads, aten ops, and on CUDA the syncs the sync debug mode warns of."""
    reads: dict = {}
    ops: dict = {}
    syncs: dict = {}
    read_now = getattr(timed_inputs, "_READ_NOW", None)
    if read_now is not None:  # on the CPU too, the path a device takes: queued, one transfer
        timed_inputs._READ_NOW = ()
    try:
        _count(fn, buffers, stacked, timer, rounds, cuda, reads, ops, syncs)
    finally:
        if read_now is not None:
            timed_inputs._READ_NOW = read_now
    res = {"host_reads": {k: max(v) for k, v in reads.items()}, "aten_ops": {k: max(v) for k, v in ops.items()}}
    if cuda:
        res["cuda_syncs_warned"] = {k: max(v) for k, v in syncs.items()}
    return res


def _count(fn, buffers, stacked, timer, rounds, cuda, reads, ops, syncs):
    for r in range(rounds):
        for name, step in _round_parts(fn, buffers, stacked, timer, 1234 + r):
            with HostReads() as h, AtenOps() as a:
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                try:
                    with warnings.catch_warnings(record=True) as w:
                        warnings.simplefilter("always")
                        step()
                finally:
                    if cuda:
                        torch.cuda.set_sync_debug_mode(0)
            reads.setdefault(name, []).append(h.n)
            ops.setdefault(name, []).append(a.n)
            syncs.setdefault(name, []).append(sum("synchroniz" in str(x.message) for x in w))


def kernel_loop(fn, buffers, stacked, timer, rounds: int) -> dict:
    """On CUDA, per part and round: kernels, memcpys and memsets the profiler sees."""
    from torch.profiler import ProfilerActivity, profile

    counts: dict = {}
    for r in range(rounds):
        for name, step in _round_parts(fn, buffers, stacked, timer, 4321 + r):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            c = {"kernels": 0, "memcpy": 0, "memset": 0}
            for e in prof.events():
                if not str(getattr(e, "device_type", "")).endswith("CUDA"):
                    continue
                k = "memcpy" if "Memcpy" in e.name else "memset" if "Memset" in e.name else "kernels"
                c[k] += 1
            counts.setdefault(name, []).append(c)
    return {k: {f: max(c[f] for c in v) for f in ("kernels", "memcpy", "memset")} for k, v in counts.items()}


def child_checks(rounds: int, cuda: bool) -> dict:
    """The rest of a child's per-round harness, ms per call: entering and leaving `harness_ops` (three
    times a round), the candidate's hook check after each call; on CUDA its runtime checks
    (opsynth.reward.cuda_state): the persisting-L2 reset before each call, the launch error and the
    set-aside after it."""
    from opsynth.reward.guards import _hook_state
    from opsynth.reward.rounds import harness_ops

    def ops():
        with harness_ops():
            pass

    part = Part(lambda: None)
    cs = None
    if cuda:
        from opsynth.reward.cuda_state import CudaState

        cs = CudaState()
    for _ in range(rounds):
        part("harness_ops", ops)
        part("hooks_changed", _hook_state)
        if cs is not None:
            part("reset_persisting_l2", cs.reset_persisting_l2)
            part("last_error", cs.last_error)
            part("persisting_l2_bytes", cs.persisting_l2_bytes)
    res = {k: _median(v) for k, v in part.ms.items()}
    if cs is not None:
        res["cuda_state_available"] = cs.available
    return res


# ---- the table ------------------------------------------------------------------------------------

COLUMNS = ["fresh_inputs", "rtt_round_ready", "call_timed", "claim", "settle", "rtt_round_returned", "fingerprint",
           "input_key", "report", "fp_and_key", "legacy_fingerprint", "legacy_input_key", "legacy_fp_and_key", "rtt_round_done",
           "rtt_noop", "rtt_noop_legacy", "poison", "keep_cpu_copy"]


def table(results: dict) -> str:
    lines = []
    names = [n for n in results["tasks"] if "parts_ms" in results["tasks"][n]]
    w = max(len(n) for n in names) if names else 8
    lines.append("per round, median ms (each part between device syncs):")
    lines.append(f"{'part':<20}" + "".join(f"{n:>{w + 2}}" for n in names))
    for c in COLUMNS:
        vals = [results["tasks"][n]["parts_ms"].get(c) for n in names]
        lines.append(f"{c:<20}" + "".join(f"{'-' if v is None else f'{v:.3f}':>{w + 2}}" for v in vals))
    rs = [results["tasks"][n]["parts_ms"].get("read_syscalls") or {} for n in names]
    for c in sorted({k for r in rs for k in r}, key=lambda k: COLUMNS.index(k) if k in COLUMNS else 99):
        lines.append(f"{'reads ' + c[4:]:<20}" + "".join(f"{'-' if r.get(c) is None else r[c]:>{w + 2}}" for r in rs))
    lines.append("")
    lines.append("real run_rounds against a RoundSession (the parent's clocks), median ms:")
    keys = ["claim_ms", "before_ms", "call_beyond_claim_ms", "after_ms", "settle_ms", "round_beyond_claim_ms", "period_ms"]
    lines.append(f"{'':<22}" + "".join(f"{n:>{w + 2}}" for n in names))
    for k in keys:
        vals = [(results["tasks"][n].get("session") or {}).get(k) for n in names]
        lines.append(f"{k:<22}" + "".join(f"{'-' if v is None else f'{v:.3f}':>{w + 2}}" for v in vals))
    for label in ("host_reads", "cuda_syncs_warned", "aten_ops", "cuda_kernels"):
        rows = {n: (results["tasks"][n].get("counts") or {}).get(label) if label != "cuda_kernels"
                else results["tasks"][n].get("cuda_kernels") for n in names}
        if not any(rows.values()):
            continue
        lines.append("")
        lines.append(f"{label} per round:")
        parts = sorted({p for r in rows.values() if r for p in r}, key=lambda p: COLUMNS.index(p) if p in COLUMNS else 99)
        lines.append(f"{'part':<20}" + "".join(f"{n:>{w + 2}}" for n in names))
        for p in parts:
            cells = []
            for n in names:
                v = (rows[n] or {}).get(p)
                if isinstance(v, dict):
                    v = "/".join(str(v[f]) for f in ("kernels", "memcpy", "memset"))
                cells.append(f"{'-' if v is None else v:>{w + 2}}")
            lines.append(f"{p:<20}" + "".join(cells))
        if label == "cuda_kernels":
            lines.append("(kernels/memcpy/memset)")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per loop (default: 200 on cuda, 60 on cpu)")
    ap.add_argument("--tasks", default=None, help="comma-separated task names (default: all)")
    ap.add_argument("--budget-s", type=float, default=100.0, help="stop starting new tasks after this many seconds")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    global SERVER
    SERVER = SessionServer()  # before anything touches the GPU
    try:
        run(args)
    finally:
        SERVER.close()


def run(args) -> None:
    dev = args.device
    cuda = dev == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    if not cuda:
        torch.set_num_threads(1)  # as a reward child on CPU (cpu_threads 1)
    rounds = args.rounds or (200 if cuda else 60)
    out = Path(args.out or REPO / "benchmarks" / "results" / f"round_overhead_{dev}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t_start = time.perf_counter()
    results = {
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch thread)",
        "torch": torch.__version__, "python": platform.python_version(), "host": platform.node(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"), "rounds": rounds,
        "one_transfer_report": _report_fn() is not None, "chunk": timed_inputs._CHUNK, "tasks": {},
    }

    def save():
        results["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        out.write_text(json.dumps(results, indent=1) + "\n")

    timer = Timer(dev)
    results["child_checks_ms"] = child_checks(200, cuda)
    save()
    tasks = _tasks(dev)
    chosen = args.tasks.split(",") if args.tasks else list(tasks)
    for name in chosen:
        if time.perf_counter() - t_start > args.budget_s:
            results["tasks"][name] = {"skipped": "budget"}
            save()
            continue
        fn, specs = tasks[name]
        trials = _trials(specs, dev)
        stacked = timed_inputs.stack_trials(trials)
        buffers = [x.clone() for x in trials[0]]
        n = rounds if name != "chunked" or cuda else max(10, rounds // 3)  # 9M elements on one CPU thread
        entry = results["tasks"][name] = {"inputs": [[list(s), str(d)] for s, d in specs], "rounds": n}
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                parts_loop(fn, buffers, stacked, timer, 3, sync)  # warm: weights, allocator, generator
                entry["parts_ms"] = parts_loop(fn, buffers, stacked, timer, n, sync)
                save()
                entry["session"] = session_loop(fn, buffers, stacked, timer, n)
                save()
                entry["counts"] = count_loop(fn, buffers, stacked, timer, 3, cuda)
                save()
                if cuda:
                    entry["cuda_kernels"] = kernel_loop(fn, buffers, stacked, timer, 1)
        except Exception as e:  # noqa: BLE001 - what was measured stays; the next task runs
            import traceback

            entry["error"] = traceback.format_exc()[-3000:]
            print(f"[round_overhead] {name} failed: {type(e).__name__}: {e}", flush=True)
        entry["task_s"] = round(time.perf_counter() - t0, 2)
        save()
        print(f"[round_overhead] {name}: {entry['task_s']} s", flush=True)
    print(table(results))
    print("other per-round child checks, ms per call:", json.dumps(results["child_checks_ms"]))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
