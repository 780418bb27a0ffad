"""Output files: checked before any work, written atomically, and an OS refusal to write
turned into bad input (exit 2) that names the path."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import InputError


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write a file so that readers see either the old file or the whole new one."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    # a short name of its own: the target's name may already be as long as names can be
    fd, tmp = tempfile.mkstemp(prefix=".hipipe-", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def check_output_path(path: str | Path, directory: bool, option: str = "-o") -> Path:
    """Fail early, before any work, when the output cannot be written."""
    if not str(path).strip():
        raise InputError(None, option, "expected a file or directory name, got an empty one")
    path = Path(path)
    try:
        return _check_output_path(path, directory, option)
    except OSError as exc:  # a name too long for the file system, a loop of links, ...
        raise InputError(str(path), None, f"cannot write here: {exc.strerror or exc}") from None


def _check_output_path(path: Path, directory: bool, option: str) -> Path:
    if path.exists() and not (path.is_file() or path.is_dir()):
        # writing atomically replaces the name: a device such as /dev/null would become a file
        raise InputError(str(path), None, f"{option} expects a regular file or directory, but a device, pipe or socket is there")
    parent = path if directory and path.exists() else path.parent
    if directory:
        if path.exists() and not path.is_dir():
            raise InputError(str(path), None, f"{option} expects a directory here, but a file is there")
        if not path.exists() and not (parent.parent if parent == path else parent).exists():
            raise InputError(str(path), None, "the parent directory does not exist")
        target = path if path.exists() else path.parent
    else:
        if path.is_dir():
            raise InputError(str(path), None, f"{option} expects a file name here, but it is a directory")
        target = path.parent if str(path.parent) else Path(".")
        if not target.exists():
            raise InputError(str(path), None, "the parent directory does not exist")
        if not target.is_dir():
            raise InputError(str(path), None, f"{target} is not a directory")
    if not os.access(target if str(target) else ".", os.W_OK):
        raise InputError(str(path), None, "cannot write here (permission denied)")
    return path


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn an OS refusal to write into bad input (exit 2) naming the path."""
    try:
        yield
    except OSError as exc:
        raise InputError(str(path), None, f"cannot write: {exc.strerror or exc}") from None
