"""User-facing errors: one clear line, no traceback, non-zero exit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Exit codes of the `ftcluster` command (documented in `ftcluster --help` and docs/reference.md).
EXIT_OK = 0
EXIT_FAILED = 1        # a launch, job or client run failed
EXIT_USAGE = 2         # click's usage errors
EXIT_USER = 3          # UserError: a bad spec, a refused plan, a bad option value
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """An error the user can fix; the CLI prints it as one line and exits non-zero.

    ``field`` names the spec field or option at fault, ``hint`` says how to fix it.
    """

    exit_code = EXIT_USER

    def __init__(self, message: str, *, field: str | None = None, hint: str | None = None):
        self.message = message
        self.field = field
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


class SpecError(UserError):
    """A cluster or model spec is malformed."""


class PlanError(UserError):
    """The requested parallel plan is impossible for this cluster and model."""


class LaunchError(UserError):
    """A launch failed after submission (the job was cancelled)."""

    exit_code = EXIT_FAILED


class Interrupted(LaunchError):
    """Ctrl-C (or SIGTERM) ended an attached launch, which cleaned up after itself: the
    documented exit code of an interruption, with what was cancelled."""

    exit_code = EXIT_INTERRUPTED


# A one-line error lists this many problems; past them, how many more (a thousand missing
# shards would make a line nobody reads; `check-checkpoint` lists them all).
PROBLEMS_SHOWN = 8


def every_problem(problems: list[str]) -> str:
    """The problems on one line: the first PROBLEMS_SHOWN of them, and how many more."""
    more = f"; and {len(problems) - PROBLEMS_SHOWN} more" if len(problems) > PROBLEMS_SHOWN else ""
    return "; ".join(problems[:PROBLEMS_SHOWN]) + more


def all_problems(errors: list[UserError]) -> UserError:
    """One error saying every problem at once (each names its own field), for the CLI's one line."""
    if len(errors) == 1:
        return errors[0]
    return type(errors[0])("; ".join(str(e) for e in errors))


def every(*steps: Callable[[], Any]) -> list[Any]:
    """Each step's result, in order; when any step raises a UserError, the others still run
    and one error says every problem."""
    results: list[Any] = []
    problems: list[UserError] = []
    for step in steps:
        try:
            results.append(step())
        except UserError as exc:
            problems.append(exc)
    if problems:
        raise all_problems(problems)
    return results


def os_error_words(exc: OSError) -> str:
    """An OSError for a person: its reason, and the file where it names one. shutil's copies
    gather their failures into one shutil.Error whose text is a list of tuples: the first one
    is said instead."""
    errors = exc.args[0] if exc.args else None
    if isinstance(errors, list) and errors and isinstance(errors[0], tuple) and len(errors[0]) == 3:
        _, dst, why = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        # why is str() of the OSError: "[Errno 27] File too large: 'src' -> 'dst'".
        reason = str(why).split("] ", 1)[-1].split(": '", 1)[0]
        return f"{dst}: {reason}{more}"
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"
