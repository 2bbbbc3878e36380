"""Outputs that appear whole or not at all: written beside their final name, then renamed."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The largest text input read (a profile, trace, prompts file or timeline): eighty times the largest
# trace a validation has written, and what a reader holds in a few hundred MB (reports/limits/).
MAX_INPUT_BYTES = 16 * 1024 * 1024


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename it over `path` (its folder made if needed, as
    the output checks promise); on failure (a full disk) nothing is left behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@contextmanager
def staged(out: str | Path, merge: bool = False) -> Iterator[Path]:
    """Yields an empty folder beside `out`. When the block succeeds it becomes `out`: replacing an
    earlier folder there, or with `merge` its files are moved into it (same names replaced). When the
    block fails, it is removed with any parent folder it made."""
    out = Path(out)
    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    tmp.chmod(0o755)  # mkdtemp makes it private; the output folder is an ordinary one
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in made:  # innermost first
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    if not out.exists():
        os.rename(tmp, out)
    elif merge:
        for file in tmp.iterdir():
            os.replace(file, out / file.name)
        tmp.rmdir()
    else:
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        os.replace(out, old / out.name)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)


def read_json(path: str | Path, what: str):
    """A UTF-8 JSON file's value; unreadable, undecodable or malformed files are bad input."""
    import json

    from contracts.cli import UsageError

    try:
        return json.loads(read_text(path, what))
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def read_text(path: str | Path, what: str) -> str:
    """A UTF-8 text file's contents; unreadable, undecodable or oversized files are bad input."""
    from contracts.cli import UsageError

    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_INPUT_BYTES:
            raise UsageError(
                f"{what} {path} is {size / 2**20:.1f} MiB, over the {MAX_INPUT_BYTES // 2**20} MiB an input may have"
            )
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not UTF-8 text") from None


def check_output_folder(out: Path, option: str, named: Path | None = None) -> None:
    """An output folder can be made or written: not an existing file, and a folder can be made in its
    nearest existing parent (tried, then removed: permission bits do not tell root, a read-only mount or a
    system folder such as /proc). Checked before any work, so that a run never fails at its end for want
    of a place. `named`: what the option named, when `out` is the folder of a file."""
    from contracts.cli import UsageError

    out = Path(out)
    named = out if named is None else named
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {out} exists and is not a folder")
    parent = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not parent.is_dir():
        raise UsageError(f"{option} {named}: {parent} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".write-check-"))
    except OSError as error:
        raise UsageError(f"{option} {named}: {parent} is not writable ({error.strerror})") from None


def check_output_file(path: Path, option: str, what: str = "file") -> None:
    """An output file can be written: not an existing folder, and its folder can be made or written."""
    from contracts.cli import UsageError

    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{option} {path} is a folder; give the name of the {what} to write")
    check_output_folder(path.parent, option, named=path)
