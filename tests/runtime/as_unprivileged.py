"""Run a command as an unprivileged uid, the way an ordinary user's evaluator runs.

`python as_unprivileged.py UID DIR -- python runner.py ...`, started as root: in a mount namespace
of its own, the folders that uid could not pass on the way to the interpreter, the package and DIR
(root's 0700 home on this image) are replaced by skeletons holding just those paths
(`opsynth.runtime.isolation.expose`), then it drops to UID with no groups and no capabilities and
execs the command. Used by the sandbox door tests for the "ordinary user" setup.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from opsynth.runtime import isolation  # noqa: E402

uid, folder, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[sys.argv.index("--") + 1:]
os.unshare(os.CLONE_NEWNS) if hasattr(os, "unshare") else isolation._unshare(isolation.CLONE_NEWNS)
isolation._mount(None, "/", None, isolation.MS_REC | isolation.MS_PRIVATE)
isolation.expose(isolation.readable_paths([folder]), writable=[folder], uid=uid)
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
os.execv(cmd[0], cmd)
