"""An output folder that appears whole or not at all: written in a hidden folder beside it, then renamed."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged(out: Path, merge: bool = False) -> Iterator[Path]:
    """Yields an empty folder beside `out`. When the block succeeds, it becomes `out`: replacing an
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
