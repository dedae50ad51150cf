"""Which names a spec's `env:` may use.

`env:` is given to every process the job starts and exported by the node-side scripts
(rank_server.sh, the Pyxis and Docker node scripts), so its NAMES reach bash as well as its
values: a name that is one of the scripts' own variables replaces it (and bash arithmetic evaluates `$(...)`
in an array subscript: `RUN_CLIENT: 'SECONDS[$(cmd)]'` ran `cmd`), a shell-special name
changes how every bash of the job behaves (BASH_ENV is expanded, then sourced, by each
non-interactive bash; Enroot is a bash script that Pyxis starts with the job's environment),
and the schedulers' and runtimes' own variables (Slurm's input variables, Pyxis/Enroot, Docker,
PMIx) change what starts the ranks. All of these are refused.

The scripts' names are read from the scripts themselves, so a variable added or renamed there is
refused at once: job_templates/ (their bash, and the string literals inside their Jinja
expressions, which become bash: `{{ ' $proxy_pids' if ... }}`; the scripts the job itself runs as
`bash SCRIPT`, kill_marked.sh, node_teardown.sh, session_guard.sh, ..., are among them), the
shipped rank-side shell files, and the FTC_* variables the rank-side Python reads. The job supervisor's Python
(ftcluster/job/) never reads the user's env: it gives it to its children only.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from ftcluster.resources import package_path, tree_path

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
NAME_RE = re.compile(_IDENT)

# Variables that bash itself sets or reads (bash(1), "Shell Variables"), plus the POSIX shells'
# ENV and the login basics the job's tools rely on.
SHELL_NAMES = frozenset(["BASH", "BASHOPTS", "BASHPID", "CDPATH", "CHILD_MAX", "COLUMNS", "COMPREPLY", "COPROC", "DIRSTACK", "EMACS", "ENV", "EPOCHREALTIME", "EPOCHSECONDS", "EUID", "EXECIGNORE", "FCEDIT", "FIGNORE", "FUNCNAME", "FUNCNEST", "GLOBIGNORE", "GLOBSORT", "GROUPS", "HISTCMD", "HISTCONTROL", "HISTFILE", "HISTFILESIZE", "HISTIGNORE", "HISTSIZE", "HISTTIMEFORMAT", "HOME", "HOSTFILE", "HOSTNAME", "HOSTTYPE", "IFS", "IGNOREEOF", "INPUTRC", "INSIDE_EMACS", "LINENO", "LINES", "LOGNAME", "MACHTYPE", "MAIL", "MAILCHECK", "MAILPATH", "MAPFILE", "OLDPWD", "OPTARG", "OPTERR", "OPTIND", "OSTYPE", "PIPESTATUS", "POSIXLY_CORRECT", "PPID", "PROMPT_COMMAND", "PROMPT_DIRTRIM", "PS0", "PS1", "PS2", "PS3", "PS4", "PWD", "RANDOM", "REPLY", "SECONDS", "SHELL", "SHELLOPTS", "SHLVL", "SRANDOM", "TIMEFORMAT", "TMOUT", "UID", "USER"])
# Prefixes of names owned by bash, Slurm (input variables of sbatch/srun/salloc), the rank
# launchers (PMIx/PMI, Open MPI's world variables), Pyxis/Enroot, Docker, ssh and ftcluster itself
# (FTC_*: those its job sets for ranks and hooks, FTC_RUN_ID, FTC_FAILURE, ..., now and later).
RESERVED_PREFIXES = ("BASH_", "COMP_", "READLINE_", "SLURM_", "SLURMD_", "SRUN_", "SBATCH_", "SALLOC_",
                     "PMIX_", "PMI_", "OMPI_COMM_WORLD_", "OMPI_ALLOW_", "ENROOT_", "PYXIS_", "DOCKER_", "SSH_",
                     "FTC_")
# Names the job library reads from its environment on purpose, as data: a user may set them
# (FTC_LIBMPI: the MPI check's libmpi, rank/ctmpi.py; SLURM_CONF: which slurm.conf the job's
# srun reads, as a site with several clusters sets it).
USER_SETTABLE = frozenset({"PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "TMPDIR", "FTC_LIBMPI", "SLURM_CONF"})
# ftcluster's own variables in the rank-side Python files (the job sets them for its ranks).
_FTC_LITERAL = re.compile(r"\b(FTC_[A-Z0-9_]+)\b")


# A Jinja string literal, single- or double-quoted, with its backslash escapes.
_JINJA_STRING = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"", re.DOTALL)


def _jinja_strings(m: re.Match[str]) -> str:
    """A Jinja expression or statement as the bash it may put into the script: its string
    literals, side by side (a name, a filter or a test of Jinja's own is no bash)."""
    return " " + " ".join(a or b for a, b in _JINJA_STRING.findall(m.group())) + " "


def _shell_code(text: str) -> str:
    """Template text as bash would see it, for name scanning: Jinja comments and bash comments
    dropped, a Jinja expression or statement replaced by the string literals in it."""
    text = re.sub(r"\{#.*?#\}", " ", text, flags=re.DOTALL)
    text = re.sub(r"\{\{.*?\}\}|\{%.*?%\}", _jinja_strings, text, flags=re.DOTALL)
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        lines.append(re.sub(r"(^|[ \t])#[^{!].*$", "", line))
    return "\n".join(lines)


# Quotes too: code kept in a string and run by `bash -c` assigns inside it.
_ASSIGN = re.compile(rf"(?:^|[\s;(&|{{'\"])({_IDENT})(?:\[[^]\n]*\])?\+?=", re.MULTILINE)
_EXPAND = re.compile(rf"\$\{{[#!]?({_IDENT})|\$({_IDENT})")
_DECLARE = re.compile(r"\b(?:local|export|declare|readonly|unset|typeset|read)((?:[ \t]+[-A-Za-z0-9_=]+)+)")
_FOR = re.compile(rf"\bfor[ \t]+({_IDENT})[ \t]+in\b")
_TEST_V = re.compile(rf"(?:\[\[|test|printf)[ \t]+-v[ \t]+({_IDENT})")
_ARITH = re.compile(r"\(\((.*?)\)\)", re.DOTALL)
_SUBSCRIPT = re.compile(rf"{_IDENT}\[([^]\n]*)\]")


def names_in_script(text: str) -> set[str]:
    """Every variable name a bash script (or job template) assigns, declares or reads,
    arithmetic contexts included. Over-inclusive on purpose: a refused name costs a rename, a
    missed one runs code."""
    code = _shell_code(text)
    names: set[str] = set()
    names.update(m.group(1) for m in _ASSIGN.finditer(code))
    names.update(m.group(1) or m.group(2) for m in _EXPAND.finditer(code))
    for m in _DECLARE.finditer(code):
        names.update(w.split("=", 1)[0] for w in m.group(1).split() if NAME_RE.fullmatch(w.split("=", 1)[0]))
    names.update(m.group(1) for m in _FOR.finditer(code))
    names.update(m.group(1) for m in _TEST_V.finditer(code))
    for pattern in (_ARITH, _SUBSCRIPT):
        for m in pattern.finditer(code):
            names.update(re.findall(_IDENT, m.group(1)))
    return names


def job_library_files() -> list[Path]:
    """The job library: the templates every job script is rendered from, and the rank-side shell
    files shipped beside them."""
    return sorted(tree_path("job_templates").glob("*.j2")) + sorted(package_path("rank").glob("*.sh"))


# The scripts the job itself runs as `bash SCRIPT ARGS` (render.scripts.job_node_scripts picks
# them per style), rendered from job_templates/ with the definitions of _marked.sh.j2 they share
# with rank_server.sh.
JOB_SCRIPTS = ("kill_marked.sh", "node_teardown.sh", "free_python_envs.sh", "session_guard.sh", "prove_in_image.sh")


def job_bash_snippets() -> list[str]:
    """The bash the job itself runs on the nodes, rendered: _marked.sh.j2's shared definitions,
    then each of its scripts. The scanner reads their templates (job_library_files); this shows
    what they become."""
    # startup: Jinja only for this look, never on the way to a spec's check
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(tree_path("job_templates"))), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    shared = env.get_template("_marked.sh.j2").module
    return ([str(getattr(shared, name)()) for name in ("unmark_python_envs", "free_python_envs", "kill_marked")]
            + [env.get_template(f"{name}.j2").render(run_id="RUN") for name in JOB_SCRIPTS])


def rank_python_files() -> list[Path]:
    return sorted(package_path("rank").glob("*.py"))


@lru_cache(maxsize=1)
def job_library_names() -> frozenset[str]:
    names: set[str] = set()
    for path in job_library_files():
        names |= names_in_script(path.read_text())
    for path in rank_python_files():
        names |= set(_FTC_LITERAL.findall(path.read_text()))
    return frozenset(names)


def env_name_problem(name: object) -> str | None:
    """Why `name` cannot be an `env:` name, or None."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        return f"{name!r} is not a valid environment variable name (letters, digits and '_', not starting with a digit)"
    if name in USER_SETTABLE:
        return None
    if name in SHELL_NAMES or name.startswith(RESERVED_PREFIXES):
        return (f"{name} is reserved (bash, Slurm, the MPI launcher, the container runtime or ftcluster set or "
                "read it); choose another name")
    if name in job_library_names():
        return f"{name} is a variable of ftcluster's job scripts, which your value would replace; choose another name"
    return None
