"""What every command line of the project shares: one-line errors with exit code 2."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch

from model.errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes get the same one-line error and exit code 2 as every other bad input."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def run_command(body: Callable[[], int | None], bad_input: tuple = (UsageError,)) -> int:
    """Run a command's body: bad input and out-of-memory become one `error:` line and exit code 2;
    `--help` and usage errors keep the exit code argparse gave them."""
    try:
        return body() or 0
    except SystemExit as stop:
        return stop.code
    except bad_input as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except torch.cuda.OutOfMemoryError:
        print("error: out of GPU memory (try fewer or shorter prompts, fewer tokens, a smaller model or "
              "another placement)", file=sys.stderr)
        return 2
