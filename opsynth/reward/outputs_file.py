"""Read an outputs file a confined child wrote, in the trusted parent, without trusting its path.

The child owns its scratch folder, so what the parent finds at `cand_outputs.pt` is the child's
choice: a FIFO (a plain `open` blocks the parent for ever), a symlink to one, to /dev/zero or to a
file elsewhere, a huge sparse file, or a crafted file (a legacy-format storage header claiming
terabytes, a zip record that inflates). `read_outputs` opens without following a link and without
blocking, accepts only a regular file below a size cap, copies it into memory (not mmap: a file
truncated under a mapping raises SIGBUS in the parent), requires torch's zip format with every
record stored uncompressed and within the cap, and only then `torch.load`s it, weights only. Every
failure is an `OutputsFileError`: the candidate's verdict `outputs_unreadable`, never an exception
in the parent.
"""

from __future__ import annotations

import io
import os
import stat
import zipfile

SLACK_BYTES = 64 << 20  # beyond CAP_FACTOR x the reference's bytes: pickles, small outputs
CAP_FACTOR = 4  # a wrong dtype (float64 for float32) or shape is still judged, not refused here


class OutputsFileError(Exception):
    """The file at an outputs path is not one the parent will load (why in the message)."""


def size_cap(ref_outputs: dict) -> int:
    """The most bytes a candidate's outputs file may have: CAP_FACTOR x every tensor the reference
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


def read_bytes(path, max_bytes: int | None) -> bytes:
    """The file's bytes, if it is a regular file (no link followed, no FIFO or device opened for
    blocking) of at most max_bytes (None: no cap)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:  # ELOOP: a symlink; ENOENT: nothing written; ENXIO and the like
        raise OutputsFileError(f"cannot open {os.path.basename(path)} ({os.strerror(e.errno) if e.errno else e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OutputsFileError(f"{os.path.basename(path)} is not a regular file (mode {stat.filemode(st.st_mode)})")
        if max_bytes is not None and st.st_size > max_bytes:
            raise OutputsFileError(f"{os.path.basename(path)} has {st.st_size} bytes, more than the {max_bytes} "
                                   "the reference's outputs allow")
        size, parts, got = st.st_size, [], 0
        while got < size:  # one read for a regular file below 2 GiB: bytes that io.BytesIO shares, not copies
            part = os.read(fd, size - got)
            if not part:
                raise OutputsFileError(f"{os.path.basename(path)} shrank while read ({got} of {size} bytes)")
            parts.append(part)
            got += len(part)
        if os.read(fd, 1):
            raise OutputsFileError(f"{os.path.basename(path)} grew while read (beyond {size} bytes)")
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)


def check_zip(data, max_bytes: int | None) -> None:
    """torch's zip format, every record stored (no inflating) and all of them within max_bytes.
    The legacy format is refused: its storage headers make the loader allocate before it reads."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
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
    if total > len(data):
        raise OutputsFileError(f"its records claim {total} bytes in a {len(data)}-byte file")


def read_outputs(path, max_bytes: int | None = None) -> dict:
    """What torch.save wrote at path, loaded weights-only from a copy in memory; OutputsFileError
    for anything else."""
    import torch

    data = read_bytes(path, max_bytes)
    check_zip(data, max_bytes)
    try:
        out = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # UnpicklingError, RuntimeError from the zip reader, a refused global
        raise OutputsFileError(f"torch.load failed: {type(e).__name__}: {str(e)[:300]}") from None
    if not isinstance(out, dict):
        raise OutputsFileError(f"holds a {type(out).__name__}, not the harness's dict")
    return out
