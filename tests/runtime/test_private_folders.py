"""An ordinary user's confined child does not browse that user's files: its home (where the Hub
token lives) and the temporary folder (where its siblings' scratch folders are) are skeletons that
hold only what the child needs (`isolation.private_folders`). The control confines the same child
with no private folders: it reads both, as every child of an ordinary user's evaluator did before."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
UID = 1_990_000_321

CHILD = textwrap.dedent("""
    import json, os, sys, tempfile
    sys.path.insert(0, {repo!r})
    from opsynth.runtime import isolation
    private = None if sys.argv[1] == "default" else []
    scratch = tempfile.mkdtemp(prefix="opsynth_eval_")
    pid = os.fork()
    if pid == 0:
        try:
            isolation.enter([scratch], must_not_write=[{repo!r}], readable=isolation.readable_paths(), private=private)
        except Exception as e:
            print("enter failed:", e, flush=True)
            os._exit(2)
        seen = {{}}
        for name, path in (("secret", sys.argv[2]), ("sibling", sys.argv[3])):
            try:
                seen[name] = open(path).read()
            except OSError as e:
                seen[name] = type(e).__name__
        open(os.path.join(scratch, "seen.json"), "w").write(json.dumps(seen))  # its own scratch stays writable
        os._exit(0)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0, st
    print(open(os.path.join(scratch, "seen.json")).read())
""")


@pytest.fixture
def user_home(tmp_path, ordinary_user):
    ordinary_user(UID)
    home = tmp_path / "home"
    tmp = home / "tmp"  # below the home: the scratch folder is then two private folders down
    secret = home / ".cache" / "huggingface" / "token"
    secret.parent.mkdir(parents=True)
    secret.write_text("hf_secret_of_the_user")
    sibling = tmp / "opsynth_eval_sibling" / "job.json"
    sibling.parent.mkdir(parents=True)
    sibling.write_text("the sibling's candidate")
    (tmp_path / "bin").mkdir()  # beside the home, so that the script's folder (on sys.path) does not hold it
    (tmp_path / "bin" / "child.py").write_text(CHILD.format(repo=str(REPO)))
    for p in [tmp_path, *tmp_path.rglob("*")]:
        os.lchown(p, UID, UID)
    for p in (secret, sibling.parent):
        p.chmod(0o600 if p.is_file() else 0o700)
    return tmp_path, secret, sibling


def _seen(tmp_path: Path, secret: Path, sibling: Path, private: str) -> dict:
    import json

    cmd = [sys.executable, str(HERE / "as_unprivileged.py"), str(UID), str(tmp_path), "--",
           sys.executable, str(tmp_path / "bin" / "child.py"), private, str(secret), str(sibling)]
    env = {**os.environ, "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "home" / "tmp")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_ordinary_users_child_sees_neither_its_home_nor_its_siblings(user_home):
    seen = _seen(*user_home, "default")
    assert seen == {"secret": "FileNotFoundError", "sibling": "FileNotFoundError"}, seen


def test_control_without_private_folders_the_child_reads_both(user_home):
    seen = _seen(*user_home, "none")
    assert seen == {"secret": "hf_secret_of_the_user", "sibling": "the sibling's candidate"}, seen
