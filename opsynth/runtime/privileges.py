"""Give up every privilege a confined child holds: capabilities, root's uid, the right to gain more.

Called in the child after its mounts are set up and before untrusted code runs. Afterwards:

- the capability sets (bounding, permitted, effective, inheritable, ambient) are empty, so neither
  the child nor anything it executes can mount, change ownership, override file permissions or
  load kernel modules, also when it still is uid 0 inside a user namespace;
- `no_new_privs` is set: a setuid binary or file capabilities cannot give any of that back;
- started as root, it runs as an unprivileged uid and gid with no supplementary groups, so files
  the evaluator keeps for itself (the signing key, mode 0600) are out of reach by permission too.

Why ctypes and not a binding: the only maintained Python binding for these calls (python-prctl)
needs libcap's headers to build, and the work is four system calls whose constants are fixed by
the kernel ABI. This module is trusted code and is never reachable from a candidate.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# A confined child runs as SANDBOX_ID_BASE + k (uid and gid): ids no account on the host has, so a
# child owns nothing but its own scratch. `k` is picked per child by the parent (sandbox.child_ids).
SANDBOX_ID_BASE = 2_000_000_000
SANDBOX_ID_SPAN = 1_000_000


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        _libc.capset.argtypes = [ctypes.POINTER(_CapHeader), ctypes.POINTER(_CapData)]
    return _libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63  # dropping a capability the kernel does not know is refused with EINVAL: tolerated


def drop_all(uid: int | None = None, gid: int | None = None) -> None:
    """Drop every capability and set no_new_privs; switch to (uid, gid) when given (needs root)."""
    libc = _c()
    for cap in range(_last_cap() + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: unknown cap
            _check(-1, f"drop capability {cap} from the bounding set")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL on kernels without ambient sets
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # clears permitted and effective (no SECBIT_KEEP_CAPS)
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()  # all zero: nothing effective, permitted or inheritable
    _check(libc.capset(ctypes.byref(hdr), data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def status() -> dict[str, str]:
    """This process's capability sets, no_new_privs, seccomp mode and ids, from /proc/self/status."""
    keys = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid", "Gid", "Groups")
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in keys:
                out[k] = v.strip()
    return out


def confined_problems(st: dict[str, str] | None = None, want_uid: int | None = None) -> list[str]:
    """What is still not given up, as readable lines (empty when the child is fully confined)."""
    st = st or status()
    bad = [f"{k}={st.get(k)}" for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb") if st.get(k, "0").strip("0")]
    if st.get("NoNewPrivs") != "1":
        bad.append(f"NoNewPrivs={st.get('NoNewPrivs')}")
    if st.get("Seccomp") != "2":
        bad.append(f"Seccomp={st.get('Seccomp')}")
    if want_uid is not None:
        if set(st.get("Uid", "").split()) != {str(want_uid)}:
            bad.append(f"Uid={st.get('Uid')}")
        if st.get("Groups", ""):
            bad.append(f"Groups={st.get('Groups')}")
    return bad
