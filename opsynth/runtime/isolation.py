"""Confine an untrusted child: it can write only to its own folders and cannot undo that.

Called in a freshly forked child, before any untrusted code runs. The child gets its own mount,
network, IPC and PID namespaces (and a user namespace when it is not root, so the same code works
for an ordinary user), then gives up every privilege (`privileges.drop_all`: no capabilities,
`no_new_privs`, and as root an unprivileged uid) and installs the system-call filter
(`syscall_filter`: no mount, namespace, ptrace or kernel-administration calls). Without that second
step a child started as root keeps CAP_SYS_ADMIN and undoes the read-only remounts with one call.

- every mount is remounted read-only except the folders it may write (its scratch folder; for a
  build child also the compiler cache); folders it must not even read (the trust key) are covered
  by an empty tmpfs;
- a fresh /proc shows only its own processes, so neither the trainer's environment
  (/proc/<pid>/environ, where a Hub token lives) nor other candidates are visible;
- its network namespace has only a loopback that is down: no sockets reach anything, the fork
  server's and Dask's included (abstract Unix sockets are per network namespace too).

Why namespaces through `unshare(2)` and not bubblewrap: the child is forked from a warm fork server
(torch already imported) and must stay in that process; bubblewrap sandboxes a new `exec`, which
would pay the torch import again for every candidate. The kernel calls are the same ones
bubblewrap makes. Python 3.12 has `os.unshare`; on 3.11 it is called through libc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import signal

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24

PR_SET_PDEATHSIG = 1

_KEEP_FLAGS = {  # per-mount flags a remount must keep (the kernel refuses to drop locked ones)
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

MODES = ("auto", "namespaces", "none")


class IsolationError(RuntimeError):
    """The sandbox could not be set up: the child must not run untrusted code."""


_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        _libc.unshare.argtypes = [ctypes.c_int]
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return _libc


def _unshare(flags: int) -> None:
    if hasattr(os, "unshare"):
        os.unshare(flags)
        return
    if _c().unshare(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if _c().mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {target}: {os.strerror(e)}")


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return path.encode().decode("unicode_escape") if "\\" in path else path


def _mounts() -> list[tuple[str, int]]:
    """(mount point, flags to keep) of every mount this process sees, parents before children."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point, opts = _unescape(parts[4]), parts[5].split(",")
            out.append((point, sum(_KEEP_FLAGS.get(o, 0) for o in opts)))
    return sorted(out, key=lambda m: m[0].count("/"))


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter(
    writable: list[str],
    hidden: list[str] = (),
    must_not_write: list[str] = (),
    readable: list[str] = (),
    ids: tuple[int, int] | None = None,
    syscall_filter: bool = True,
    private: list[str] | None = None,
) -> None:
    """Confine the calling process (a fresh fork; single-threaded) and its future children.

    Returns in a new process (PID 1 of the new PID namespace); the process that called it waits for
    that one and exits with its status, so a caller's pid, process group and exit code keep their
    meaning. Raises IsolationError if any part fails: never run untrusted code after that.

    `ids` (uid, gid): started as root, the child ends as these; `readable` are the paths it must
    still reach as that uid (the interpreter, the package, the extension cache). Whatever the start,
    it ends with no capabilities, `no_new_privs`, and the system-call filter (`syscall_filter`).

    `private` (None: `private_folders()` from this process's environment; a caller that has set
    the child's environment already names the evaluator's own): folders replaced by skeletons that hold only the needed
    paths below them, whatever their modes. A child that keeps its caller's uid (an ordinary user's
    evaluator) could otherwise read all that user's files: the Hub token in the home folder, the
    scratch folders of its sibling candidates.
    """
    from opsynth.runtime import privileges

    if syscall_filter:
        _ = syscall_filter_module()._binding()  # loaded while the whole file system is still in view
    uid, gid = os.getuid(), os.getgid()
    switch = ids is not None and uid == 0
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWPID
    if uid != 0:
        flags |= CLONE_NEWUSER
    try:
        _unshare(flags)
        if uid != 0:  # keep our own ids inside, so file ownership reads as before
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as e:
        raise IsolationError(f"unshare failed: {e}") from None
    pid = os.fork()  # the new PID namespace applies to children: this one is its PID 1
    if pid:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except ChildProcessError:
                os._exit(1)
            except InterruptedError:
                continue
        os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
    _c().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the process above
    try:
        _confine_mounts(writable, hidden)
        if private is None:
            private = private_folders(switched=switch)
        if switch or private:
            expose([*readable, *writable], writable, ids[0] if switch else None, private=private,
                   by_modes=switch)
        privileges.drop_all(*(ids if switch else (None, None)))
        if syscall_filter:
            syscall_filter_module().install()
        bad = privileges.confined_problems(want_uid=ids[0] if switch else None)
        if not syscall_filter:
            bad = [b for b in bad if not b.startswith("Seccomp=")]
        if bad:
            raise IsolationError("privileges still held after dropping them: " + ", ".join(bad))
        _verify(must_not_write, writable, hidden)
    except (OSError, IsolationError) as e:
        raise IsolationError(str(e)) from None


def syscall_filter_module():
    from opsynth.runtime import syscall_filter as mod

    return mod


def readable_paths(extra: list[str] = ()) -> list[str]:
    """What a child running as an unprivileged uid must still read: the interpreter, its libraries,
    the package, and the caller's extra paths."""
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [sys.prefix, sys.base_prefix, repo, *[p for p in sys.path if p and os.path.isabs(p)], *extra]
    return list(dict.fromkeys(str(p) for p in paths if p and os.path.exists(p)))


def _confine_mounts(writable: list[str], hidden: list[str]) -> None:
    writable = [os.path.realpath(w) for w in writable]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    for w in writable:
        _mount(w, w, None, MS_BIND | MS_REC)  # its own mount, so the read-only pass can skip it
    for point, keep in _mounts():
        if _inside(point, writable) or _inside(point, ["/proc"]):
            continue
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError as e:
            # Pseudo file systems under /sys may refuse; they hold nothing the evaluator trusts.
            # Everything else must become read-only, or the child does not run.
            if not _inside(point, ["/sys"]) and e.errno not in (errno.ENOENT,):
                raise IsolationError(f"cannot make {point} read-only: {e}")
    for h in hidden:
        if os.path.isdir(h):
            _mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=0555")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # only this namespace's processes


def _blocking_ancestor(path: str) -> str | None:
    """The highest folder above `path` that a uid owning nothing cannot pass (no o+x), if any."""
    parts = path.strip("/").split("/")[:-1]
    cur = ""
    for part in parts:
        cur += "/" + part
        try:
            if not os.stat(cur).st_mode & 0o001:
                return cur
        except OSError:
            return None
    return None


def _skeleton_dirs(top: str, rel: str) -> None:
    """mkdir -p top/rel with every level 0755 whatever the umask (a 0700 level would block again)."""
    cur = top
    for part in [p for p in rel.split("/") if p and p != "."]:
        cur = os.path.join(cur, part)
        if not os.path.isdir(cur):
            os.mkdir(cur)
            os.chmod(cur, 0o755)


def _usable_by(path: str, uid: int | None) -> bool:
    st = os.stat(path)
    if uid is not None and st.st_uid == uid:
        return True
    return bool(st.st_mode & (0o001 if os.path.isdir(path) else 0o004))


def private_folders(switched: bool) -> list[str]:
    """Folders a child must not browse. Switched to a uid of its own (started as root), the modes
    already keep it out of what is not world-readable (the evaluator's 0700 home, its siblings' 0700
    scratch folders, each owned by another sandbox uid), so none. Kept at its caller's uid: the
    caller's home, temporary folders (sibling scratch folders are there), shared memory and runtime
    folder, whose files that uid owns."""
    if switched:
        return []
    import tempfile

    cand = [os.path.expanduser("~"), tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm", f"/run/user/{os.getuid()}"]
    return list(dict.fromkeys(os.path.realpath(c) for c in cand if c and os.path.isdir(c) and os.path.realpath(c) != "/"))


def expose(paths: list[str], writable: list[str] = (), uid: int | None = None, private: list[str] = (),
           by_modes: bool = True) -> None:
    """Let a child reach `paths` and no more through some folders: those an unprivileged uid could not
    pass (root's 0700 home; `by_modes`) and the `private` ones, whatever their modes.

    Each such folder is replaced, in this mount namespace only, by a read-only skeleton that holds
    exactly the needed paths (bound from the original, read-only unless in `writable`); everything
    else in it (keys, tokens, other users' files) is gone from the view. The host's modes never
    change. The originals are reached through a descriptor opened before the skeleton covers them.
    """
    real = sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)}, key=len)
    writable = [os.path.realpath(w) for w in writable]
    # A needed folder the uid could not enter anyway (a 0700 folder of root's on sys.path) is left
    # out, so that it does not block the needed paths below it (they get skeleton folders instead).
    if by_modes:
        real = [p for p in real if _usable_by(p, uid)]
    covered = {os.path.realpath(f) for f in private if os.path.isdir(f)}
    if by_modes:
        covered |= {b for b in map(_blocking_ancestor, real) if b is not None}
    covered -= set(real)  # a folder needed whole stays whole

    def above(p: str) -> str | None:  # the nearest covered folder strictly above p
        tops = [c for c in covered if c != p and _inside(p, [c])]
        return max(tops, key=len) if tops else None

    # Each covered folder's skeleton holds the needed paths whose nearest covered folder it is, and
    # the covered folders below it that hold needed paths (bound whole, then narrowed by their own
    # skeleton, mounted after it: the original is reached through that bind). A covered folder below
    # a needed path is reached through that path's bind.
    groups: dict[str, list[str]] = {}
    for p in real:
        c = above(p)
        if c is not None:
            groups.setdefault(c, []).append(p)
    for c in sorted(covered, key=len, reverse=True):  # deepest first: a parent learns of its children
        if c not in groups:
            continue
        up = above(c)
        if up is not None and not any(_inside(c, [p]) for p in groups.get(up, [])):
            groups.setdefault(up, []).append(c)
    for c in covered - set(groups):
        up = above(c)
        if up is None or any(_inside(c, [p]) for p in groups.get(up, [])):
            groups[c] = []  # nothing needed below it, but in view: an empty skeleton
    for c in groups:
        groups[c] = [p for p in groups[c] if not any(o != p and _inside(p, [o]) for o in groups[c])]
    for b in sorted(groups, key=len):
        fd = os.open(b, os.O_PATH | os.O_DIRECTORY)
        try:
            _mount("tmpfs", b, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            for p in groups[b]:
                rel = os.path.relpath(p, b)
                src, dst = f"/proc/self/fd/{fd}/{rel}", os.path.join(b, rel)
                _skeleton_dirs(b, os.path.dirname(rel) if not os.path.isdir(src) else rel)
                if not os.path.isdir(src):
                    open(dst, "a").close()
                _mount(src, dst, None, MS_BIND | MS_REC)
                if not _inside(p, writable):
                    _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
            _mount(None, b, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        finally:
            os.close(fd)


def _verify(must_not_write: list[str], writable: list[str], hidden: list[str] = ()) -> None:
    """Refuse to go on unless the places that matter really are read-only (and hidden ones empty) here."""
    for h in hidden:
        try:
            if os.listdir(h):
                raise IsolationError(f"{h} is still visible inside the sandbox")
        except OSError:
            pass  # EACCES / ENOENT: as it should be
    for d in must_not_write:
        if not os.path.isdir(d) or _inside(os.path.realpath(d), [os.path.realpath(w) for w in writable]):
            continue
        probe = os.path.join(d, f".opsynth-isolation-probe-{os.getpid()}")
        try:
            fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
        except OSError:
            continue  # EROFS / EACCES: as it should be
        os.close(fd)
        os.unlink(probe)
        raise IsolationError(f"{d} is still writable inside the sandbox")


def probe() -> tuple[bool, str]:
    """Whether `enter` works here, all of it (namespaces, privileges, filter): tried in a throwaway
    child that then tries to remount and to write outside its scratch. (ok, why not)."""
    import tempfile

    scratch = tempfile.mkdtemp(prefix="opsynth_probe_")
    ids = None
    if os.getuid() == 0:
        from opsynth.runtime.privileges import SANDBOX_ID_BASE

        ids = (SANDBOX_ID_BASE, SANDBOX_ID_BASE)
        os.chown(scratch, *ids)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(r)
        try:
            enter([scratch], must_not_write=[os.path.dirname(scratch), os.path.dirname(__file__)],
                  readable=readable_paths(), ids=ids)
            with open(os.path.join(scratch, "ok"), "w") as f:
                f.write("ok")
            import socket

            msg = "ok"
            try:
                _mount(None, "/", None, MS_REMOUNT | MS_BIND)
                msg = "a remount succeeded inside the sandbox"
            except OSError:
                pass
            try:
                socket.create_connection(("127.0.0.1", 9), timeout=1)
                msg = "network reachable inside the sandbox"
            except OSError:
                pass
            os.write(w, msg.encode())
        except BaseException as e:  # noqa: BLE001
            os.write(w, f"{type(e).__name__}: {e}".encode()[:500])
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        msg = f.read()
    os.waitpid(pid, 0)
    ok = msg == "ok" and os.path.exists(os.path.join(scratch, "ok"))
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    return ok, ("" if ok else (msg or "the probe child died"))
