"""What a command's run comes to: its exit code, and the two errors that end it early.

0 done; 1 it ran and the answer is a failure (``Failure``); 2 a usage error (``UsageError``: the
command line, or a file, database or setting it names, cannot be used; nothing was written), and
no GPU to run on for a command that needs one (``codegen.worker.NoGpu``, said in one line by
``checks.no_gpu_line``); 130 interrupted (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(ValueError):
    """The command line, or a file, database or setting it names, cannot be used (exit 2)."""


class Failure(Exception):
    """The command ran and its answer is a failure or nothing found (exit 1)."""
