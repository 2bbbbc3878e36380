"""What every command line shares: bad input becomes one `error:` line and exit code 2; an interrupt
(Ctrl-C, or SIGTERM as `timeout` sends) one `error: interrupted` line and 128 + the signal's number."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Callable


class UsageError(ValueError):
    """Bad input from the user: a malformed file, an unknown key or choice, a value out of range, an
    output that cannot be written, a model that does not fit, a missing GPU or checkpoint."""


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes get the same one-line error and exit code 2 as every other bad input."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class Interrupted(BaseException):
    """SIGTERM raised in the body, as Ctrl-C raises KeyboardInterrupt: the body's `finally` blocks and
    `staged` outputs clean up. A BaseException, so that no `except Exception` swallows it."""


def _raise_interrupted(signum, frame):
    raise Interrupted


def run_command(body: Callable[[], int | None], also_bad_input: tuple[type[BaseException], ...] = ()) -> int:
    """Run a command's body: UsageError (and `also_bad_input`, e.g. out of GPU memory) becomes one
    `error:` line and exit code 2; `--help` and usage errors keep argparse's exit code. SIGINT and SIGTERM
    end it with one `error: interrupted` line and the shells' code for the signal, 128 + its number (130,
    143), after its outputs are cleaned up; SIGTERM's earlier handler is back once the body ends."""
    in_main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGTERM, _raise_interrupted) if in_main_thread else None
    try:
        return body() or 0
    except SystemExit as stop:
        return stop.code
    except (UsageError, *also_bad_input) as error:
        print(f"error: {_one_line(error)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted) as stop:
        caught = signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM
        print(f"error: interrupted ({caught.name})", file=sys.stderr)
        return 128 + caught
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)  # None: one set outside Python


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


def require_modules(command: str, modules: tuple[str, ...], install: str) -> None:
    """Exit with one line naming what to install when a command's dependencies are missing."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        print(f"error: {command} needs {', '.join(missing)}, which is not installed ({install})", file=sys.stderr)
        raise SystemExit(2)


def parse_choices(text: str, valid: tuple[str, ...], what: str) -> tuple[str, ...]:
    """Names joined by ',' or '+' (or `all`), each one of `valid`; repeats dropped, order kept."""
    chosen = (
        valid
        if text.strip() == "all"
        else tuple(dict.fromkeys(v.strip() for v in text.replace("+", ",").split(",") if v.strip()))
    )
    bad = [v for v in chosen if v not in valid]
    if bad or not chosen:
        raise UsageError(
            f"unknown {what} {', '.join(repr(b) for b in bad) or repr(text)}; valid: {', '.join(valid)}, or all"
        )
    return chosen


def api_attribute(api: dict[str, str], package: str, name: str):
    """A package's `__getattr__` for its API: `name` is imported from its module on first use, so
    importing the package (as `python -m` does before `--help`) needs none of its heavy dependencies."""
    if name not in api:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(api[name]), name)
