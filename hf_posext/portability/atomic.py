"""Write an output whole or not at all, the one place that does: `atomic_write(path, text)` for a
file (results files, summaries), `with atomic_output(out) as tmp:` for a folder or a file built in
steps (export's folders and GGUF files, docs/portability.md "Exact forms per reader"). The
recipe's checkpoints are the one exception: every rank writes them (accelerate's collective save),
so training/checkpoint.py renames its finished folder itself."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path


class atomic_output:
    """`with atomic_output(out) as tmp:` write into `tmp` (a hidden sibling of `out`); on success
    it is renamed to `out`, on any error removed, so `out` is whole or absent. OS errors
    (read-only place, full disk) become one line naming `out`."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        try:
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".partial",
                                             dir=self.out.resolve().parent))
        except OSError as err:
            raise _one_line(err, self.out) from None
        return self.tmp / self.out.name

    def __exit__(self, kind, err, tb) -> None:   # exceptions always propagate
        try:
            if kind is None:
                if self.out.is_dir():  # an empty folder given as the output: replace it
                    self.out.rmdir()
                os.replace(self.tmp / self.out.name, self.out)
        except OSError as failure:
            err, kind = failure, OSError
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if kind is not None and issubclass(kind, OSError):
            raise _one_line(err, self.out) from None


def _one_line(err: OSError, out: Path) -> OSError:
    reason = {errno.ENOSPC: "no space left on the device", errno.EACCES: "permission denied",
              errno.EROFS: "read-only file system", errno.EPERM: "operation not permitted"}.get(
        err.errno, err.strerror or str(err))
    failure = OSError(f"cannot write {out}: {reason}; nothing was written. Free space or choose a "
                      "writable place, then run again.")
    failure.errno = err.errno
    return failure


def create_new(path: Path):
    """A new file at `path`, opened for writing, never through a symbolic link: a link planted
    at a predictable name (the temporary file, the write probe) would otherwise have the file it
    points to overwritten. O_EXCL refuses any existing entry, links included (POSIX open(2))."""
    path.unlink(missing_ok=True)   # a stale leftover (or a planted link: removes the link only)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    return open(fd, "w", encoding="utf-8", newline="")


def atomic_write(path: Path, text: str) -> None:
    """Write `path` whole or not at all; `os.replace` swaps the entry itself, so a symbolic link
    at `path` is replaced, never written through."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with create_new(tmp) as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
