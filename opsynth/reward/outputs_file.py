"""A child's outputs, handed to the trusted parent through a channel the parent made.

The parent makes a memfd per child (`OutputsChannel`) and hands it over with the job; the child's
harness writes `torch.save`'s bytes into it (`channel_writer`, bound before untrusted code runs).
Nothing lies at a path in the child's scratch for the parent to open, so the child cannot put a
FIFO, a symlink (to a FIFO, to /dev/zero, to a file elsewhere) or a file it changes later where the
outputs should be: those attacks on the file the parent used to read are gone with the file. What
the child still chooses is the channel's contents and size: once the child has ended the parent
seals it (`seal`: no write, shrink or grow by anyone from then on, refused while any process still
has it mapped for writing), accepts at most a size cap, requires torch's zip format with every
record stored uncompressed and within the cap, and only then `torch.load`s it in place (mapped:
sealed, it cannot change or shrink under the mapping), weights only. Every failure is an
`OutputsFileError`: the candidate's verdict `outputs_unreadable`, never an exception in the parent.

Why not the file of before: on the H200 the outputs of a GPU-sized task are 0.5-2 GB, written to
the scratch folder by the child and then read and copied twice by the parent (a copy into memory,
then torch.load's); judging one candidate took 1-4 s, most of it that trip.
"""

from __future__ import annotations

import errno
import fcntl
import os
import zipfile
from typing import Callable

SLACK_BYTES = 64 << 20  # beyond CAP_FACTOR x the reference's bytes: pickles, small outputs
CAP_FACTOR = 4  # a wrong dtype (float64 for float32) or shape is still judged, not refused here


class OutputsFileError(Exception):
    """What a child left in its outputs channel is not something the parent will load (why in the message)."""


def size_cap(ref_outputs: dict) -> int:
    """The most bytes a candidate's outputs may have: CAP_FACTOR x every tensor the reference
    saved (trials, second shape, kept rounds), plus SLACK_BYTES."""
    return CAP_FACTOR * _tensor_bytes(ref_outputs) + SLACK_BYTES


def _tensor_bytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


class OutputsChannel:
    """A memfd the parent makes for one child's outputs and hands it (`run_child(channels=...)`).

    The child writes `torch.save`'s bytes into it (`channel_writer`); once the child has ended the
    parent seals it (no write, shrink or grow by anyone from then on) and maps it: the tensors are
    loaded in place, with no file on disk, no copy into the parent's memory, and no path for the
    child to put something else at. Close it when the outputs are no longer needed (the loaded
    tensors keep their mapping)."""

    def __init__(self, name: str = "opsynth-outputs"):
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def read(self, max_bytes: int | None = None) -> dict:
        return read_channel(self.fd, max_bytes)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


NEEDED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def seal(fd: int) -> bool:
    """Make the channel's contents final: True once sealed; False where this kernel cannot seal a
    memfd at all (then the caller judges a private copy); OutputsFileError when they could still
    change (a writable mapping still open somewhere, or the child sealed the seals without a write seal)."""
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, NEEDED_SEALS | fcntl.F_SEAL_SEAL)
    except OSError as e:
        if e.errno == errno.EBUSY:  # F_SEAL_WRITE refused: a shared writable mapping of it still exists
            raise OutputsFileError("the outputs channel is still mapped for writing by another process") from None
        if e.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # no sealing on this kernel
            return False
        if e.errno != errno.EPERM:  # EPERM: already sealed against sealing; what matters is checked below
            raise OutputsFileError(f"the outputs channel cannot be sealed ({os.strerror(e.errno)})") from None
    have = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    if have & NEEDED_SEALS != NEEDED_SEALS:
        raise OutputsFileError("the outputs channel was sealed against sealing with its contents still writable")
    return True


def _private_copy(fd: int, size: int) -> bytes:
    """The channel's bytes copied into this process (unsealed: what is judged cannot change after)."""
    parts, got = [], 0
    while got < size:
        part = os.pread(fd, size - got, got)
        if not part:
            raise OutputsFileError(f"the outputs channel shrank while read ({got} of {size} bytes)")
        parts.append(part)
        got += len(part)
    if os.pread(fd, 1, size):
        raise OutputsFileError(f"the outputs channel grew while read (beyond {size} bytes)")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_channel(fd: int, max_bytes: int | None = None) -> dict:
    """What torch.save wrote into an outputs channel, loaded weights-only in place once the channel is
    sealed (a private copy where it cannot be); OutputsFileError for anything else (nothing written,
    more than max_bytes, not torch's zip format with stored records, not the harness's dict)."""
    import io

    import torch

    sealed = seal(fd)
    size = os.fstat(fd).st_size
    if size == 0:
        raise OutputsFileError("nothing was written into the outputs channel")
    if max_bytes is not None and size > max_bytes:
        raise OutputsFileError(f"the outputs channel holds {size} bytes, more than the {max_bytes} the reference's outputs allow")
    path = f"/proc/self/fd/{fd}"  # this process's own view of its descriptor: nothing the child named
    if sealed and not os.path.exists(path):
        sealed = False  # no /proc here: a copy
    if sealed:
        with open(path, "rb") as f:
            check_zip(f, size, max_bytes)
        source = path
    else:
        data = _private_copy(fd, size)
        check_zip(io.BytesIO(data), len(data), max_bytes)
        source = io.BytesIO(data)
    try:
        out = torch.load(source, mmap=sealed, weights_only=True)  # sealed: the mapping cannot change or shrink
    except Exception as e:  # UnpicklingError, RuntimeError from the zip reader, a refused global
        raise OutputsFileError(f"torch.load failed: {type(e).__name__}: {str(e)[:300]}") from None
    if not isinstance(out, dict):
        raise OutputsFileError(f"holds a {type(out).__name__}, not the harness's dict")
    return out


def channel_writer(save: Callable | None = None) -> Callable[[object], None]:
    """In a child: `write(obj)`, which saves obj into the outputs channel its parent handed it, with
    `save` (torch.save) and the os functions bound now, before any untrusted code runs."""
    from opsynth.runtime.child import FDS

    fd = FDS.get("outputs")
    if save is None:
        import torch

        save = torch.save
    fdopen, dup, ftruncate, lseek = os.fdopen, os.dup, os.ftruncate, os.lseek

    def write(obj) -> None:
        if fd is None:
            raise RuntimeError("this child was started without an outputs channel")
        ftruncate(fd, 0)  # whatever was written into it before, the harness's bytes alone, from the start
        lseek(fd, 0, os.SEEK_SET)
        with fdopen(dup(fd), "wb") as f:
            save(obj, f)

    return write


def check_zip(f, size: int, max_bytes: int | None) -> None:
    """torch's zip format, every record stored (no inflating) and all of them within max_bytes; `f`
    a file object of `size` bytes (only its directory is read). The legacy format is refused: its
    storage headers make the loader allocate before it reads."""
    try:
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise OutputsFileError(f"not a torch zip file ({e})") from None
    if not infos:
        raise OutputsFileError("an empty zip file")
    packed = [i.filename for i in infos if i.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise OutputsFileError(f"compressed records ({packed[:3]}): torch.save stores them uncompressed")
    total = sum(i.file_size for i in infos)
    if max_bytes is not None and total > max_bytes:
        raise OutputsFileError(f"its records hold {total} bytes, more than {max_bytes}")
    if total > size:
        raise OutputsFileError(f"its records claim {total} bytes in a {size}-byte file")
