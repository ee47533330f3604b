"""Task files that try to get out of a verifier worker, as an untrusted task file would.

Each attempt (remount the package's mount read-write, write a file into the package, read the
pool's HF_TOKEN from the environment or from the parent's /proc entry, connect to a socket the test
listens on) records "ok" when it worked, else why not, in `attack-<tag>-<where>.json` in the
worker's working folder (the test reads it from the pool's temp dir). The task is otherwise a normal,
acceptable one, so its verdict shows whether the attempts changed anything.

- `python_task(..., where="top")`: the attempts run at the module's top level (every load);
- `python_task(..., where="forward")`: inside forward (through ctypes: tasks are not statically
  checked, so ctypes is as good as C++ here);
- `native_task(...)`: a C library the task compiles with `cc` and loads, whose static initialiser
  makes the same attempts before any Python of the task runs again (a load_inline extension's
  static initialiser would do the same, minutes of compiling later).
"""

from __future__ import annotations

ATTEMPTS = ("remount", "write_package", "secret", "socket")

_PY_ATTACK = r'''
import ctypes
import json
import os
import socket

_PKG, _PORT, _TAG = {pkg!r}, {port}, {tag!r}
_KEEP = {{"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}}


def _mount_of(path):
    """(mount point, its per-mount flags) of the mount holding path."""
    best = ("/", 0)
    for line in open("/proc/self/mountinfo"):
        parts = line.split()
        point, opts = parts[4], parts[5].split(",")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
            best = (point, sum(_KEEP.get(o, 0) for o in opts))
    return best


def _attack(where):
    out = {{}}
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    point, flags = _mount_of(_PKG)
    # Read-write again, same flags otherwise (a no-op where nothing made it read-only).
    if libc.mount(None, point.encode(), None, 32 | 4096 | flags, None) == 0:  # MS_REMOUNT | MS_BIND
        out["remount"] = "ok"
    else:
        out["remount"] = os.strerror(ctypes.get_errno())
    try:
        with open(os.path.join(_PKG, f"_attack_{{_TAG}}_{{where}}"), "w") as f:
            f.write("written by a task\n")
        out["write_package"] = "ok"
    except OSError as e:
        out["write_package"] = str(e)
    token = os.environ.get("HF_TOKEN")
    if not token:
        try:
            env = open(f"/proc/{{os.getppid()}}/environ", "rb").read().split(b"\0")
            token = next((e[9:].decode() for e in env if e.startswith(b"HF_TOKEN=")), None)
        except OSError:
            pass
    out["secret"] = "ok" if token else "not found"
    try:
        with socket.create_connection(("127.0.0.1", _PORT), timeout=3) as s:
            s.sendall(f"{{_TAG}}-{{where}}".encode())
        out["socket"] = "ok"
    except OSError as e:
        out["socket"] = str(e)
    with open(f"attack-{{_TAG}}-{{where}}.json", "w") as f:
        json.dump(out, f)
'''

_NATIVE = r'''
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>

static const char* ok(int good) { return good ? "ok" : strerror(errno); }

__attribute__((constructor)) static void attack(void) {
    const char* point = getenv("ATTACK_POINT");
    unsigned long flags = strtoul(getenv("ATTACK_FLAGS"), 0, 10);
    char target[4096], report[4096];
    snprintf(target, sizeof target, "%s/_attack_%s_native", getenv("ATTACK_PKG"), getenv("ATTACK_TAG"));
    snprintf(report, sizeof report, "attack-%s-native.json", getenv("ATTACK_TAG"));
    FILE* r = fopen(report, "w");
    if (!r) return;
    fprintf(r, "{\"remount\": \"%s\", ", ok(mount(NULL, point, NULL, MS_REMOUNT | MS_BIND | flags, NULL) == 0));
    int fd = open(target, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    fprintf(r, "\"write_package\": \"%s\", ", ok(fd >= 0));
    if (fd >= 0) close(fd);
    const char* token = getenv("HF_TOKEN");
    fprintf(r, "\"secret\": \"%s\", ", token && *token ? "ok" : "not found");
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(getenv("ATTACK_PORT")));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    fprintf(r, "\"socket\": \"%s\"}", ok(s >= 0 && connect(s, (struct sockaddr*)&a, sizeof a) == 0));
    if (s >= 0) close(s);
    fclose(r);
}
'''

_TASK = '''import torch
import torch.nn as nn
{prelude}

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.lin = nn.Linear(features, features)
        self.tried = False

    def forward(self, x):
{forward_attack}        return torch.relu(self.lin(x))


batch_size = 32
features = 512


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
'''


def python_task(pkg: str, port: int, tag: str, where: str) -> str:
    """A task making the attempts at its module's top level (`where="top"`) or in forward."""
    prelude = _PY_ATTACK.format(pkg=pkg, port=port, tag=tag)
    if where == "top":
        return _TASK.format(prelude=prelude + '\n_attack("top")\n', forward_attack="")
    attack = "        if not self.tried:\n            self.tried = True\n            _attack('forward')\n"
    return _TASK.format(prelude=prelude, forward_attack=attack)


def native_task(pkg: str, port: int, tag: str) -> str:
    """A task whose top level builds and loads a C library that makes the attempts as it loads."""
    prelude = _PY_ATTACK.format(pkg=pkg, port=port, tag=tag) + f'''
import subprocess

_point, _flags = _mount_of(_PKG)
os.environ.update(ATTACK_POINT=_point, ATTACK_FLAGS=str(_flags), ATTACK_PKG=_PKG, ATTACK_TAG=_TAG,
                  ATTACK_PORT=str(_PORT))
if not os.path.exists("attack_{tag}.so"):
    with open("attack_{tag}.c", "w") as f:
        f.write({_NATIVE!r})
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", "attack_{tag}.so", "attack_{tag}.c"], check=True)
ctypes.CDLL(os.path.abspath("attack_{tag}.so"))
'''
    return _TASK.format(prelude=prelude, forward_attack="")
