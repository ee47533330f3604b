"""The system-call filter every confined child installs before untrusted code runs.

A deny list over libseccomp (through its official Python binding when installed, else `pyseccomp`,
the pure-ctypes binding with the same API): the calls that administer the kernel, change mounts or
namespaces, or reach into another process are refused with EPERM; everything else is allowed, so
CUDA, the profiler (CUPTI), Triton, nvcc and the C++ toolchain run unchanged. libseccomp resolves the
call numbers for the running architecture and refuses calls made through a foreign one (32-bit
`int 0x80`, x32) with the filter's bad-architecture action (kill).

Why a deny list, not an allow list: the CUDA driver, CUPTI and the compilers make hundreds of calls
that change between releases; a missing entry in an allow list would break builds on the next driver.
The denied calls are those that undo the rest of the sandbox or attack the host, and none of them is
needed to build or run a kernel (checked on the H200 with the GPU reward suite).
"""

from __future__ import annotations

import errno

# Refused outright. Names libseccomp does not know on this architecture are skipped.
DENIED = (
    # mounts and namespaces: the sandbox's read-only view and covers must stay as they are
    "mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    # reaching into other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # kernel administration
    "bpf", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "sethostname", "setdomainname",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm", "lookup_dcookie",
    "nfsservctl", "vhangup", "uselib", "personality", "_sysctl",
    # keyrings, file handles, fault handling, async rings that bypass this filter
    "keyctl", "add_key", "request_key", "open_by_handle_at", "name_to_handle_at", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "fanotify_init", "perf_event_open",
)

# clone with any of these flags makes a new namespace: refused. clone3 passes its flags in memory
# the filter cannot read, so it answers ENOSYS and glibc falls back to clone (as Docker's profile does).
CLONE_NS_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080,
}


def _binding():
    try:
        import seccomp  # the official binding (Debian/Ubuntu python3-seccomp)
    except ImportError:
        try:
            seccomp = _import_pyseccomp()
        except (ImportError, RuntimeError, OSError) as e:  # libseccomp.so.2 not found or not loadable
            raise OSError(errno.ENOSYS, f"no libseccomp binding ({e}); install libseccomp2 and `pip install pyseccomp`") from None
    return seccomp


def _import_pyseccomp():
    """pyseccomp, finding libseccomp at $OPSYNTH_LIBSECCOMP when set (a copy carried to a machine
    whose image lacks it); pyseccomp itself only asks ctypes.util.find_library."""
    import ctypes.util
    import os

    path = os.environ.get("OPSYNTH_LIBSECCOMP")
    if not path:
        import pyseccomp

        return pyseccomp
    real = ctypes.util.find_library
    ctypes.util.find_library = lambda name: path if name == "seccomp" else real(name)
    try:
        import pyseccomp
    finally:
        ctypes.util.find_library = real
    return pyseccomp


def available() -> tuple[bool, str]:
    """Whether a filter can be built here (the binding and libseccomp load)."""
    try:
        _binding()
    except OSError as e:
        return False, str(e)
    return True, ""


def install() -> list[str]:
    """Load the filter into the calling thread's process (after `no_new_privs`); returns what it refuses."""
    sc = _binding()
    f = sc.SyscallFilter(sc.ALLOW)
    refused = []
    for name in DENIED:
        try:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
            refused.append(name)
        except (OSError, ValueError, RuntimeError):
            continue  # not a call on this architecture
    for flag in CLONE_NS_FLAGS.values():
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    try:
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        refused.append("clone3")
    except (OSError, ValueError, RuntimeError):
        pass
    f.load()
    return refused
