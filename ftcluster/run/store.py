"""The local run store: what was launched where, so status/logs/stop can re-attach later.

A small SQLite file under the state directory ($FTCLUSTER_STATE_DIR, default
~/.local/state/ftcluster); no server. Each run keeps its plan and paths as JSON.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterator

from ftcluster.errors import UserError


def state_dir() -> Path:
    env = os.environ.get("FTCLUSTER_STATE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "ftcluster"


def cache_root() -> Path:
    """What can be made again: the local tritonserver bundle, compiled job templates, liveness
    probe requests ($FTCLUSTER_CACHE, default ~/.cache/ftcluster)."""
    env = os.environ.get("FTCLUSTER_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "ftcluster"


def keep_in_cache(path: Path, text: str) -> None:
    """Write a cache entry (under cache_root) whole or not at all: launches may race. A cache
    that cannot be written only costs the making again."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


# What a record's status can be: written by launch (and a run folder's adoption), stop and the
# forwarding to a login node.
RUN_STATUSES = ("CREATED", "SUBMITTED", "SERVING", "COMPLETED", "FAILED", "CANCELLED", "STOPPED", "REMOTE")


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    created: float
    cluster_name: str
    cluster_source: str
    scheduler: str
    style: str
    run_dir: str
    nodes: int
    model: str
    job_id: str | None = None
    status: str = "CREATED"
    endpoint: str | None = None
    plan: dict[str, Any] = field(default_factory=dict)
    # The launcher that ran it (ftcluster.spec.launch_styles.LAUNCHERS); "" in runs recorded before it was
    # kept: their scheduler and style name it.
    launcher: str = ""
    # The run this one succeeded (a hand-over before that run's time limit); None: a first run.
    predecessor: str | None = None
    # A replica set's member: the set's run id (its front's) and the member's index.
    replica_of: str | None = None
    replica: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What JSON gives back for each annotation of RunRecord's fields.
_JSON_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float),
                                            "dict[str, Any]": (dict,)}
_FIELD_TYPES = {f.name: _JSON_TYPES[str(f.type).removesuffix(" | None")]
                + ((type(None),) if str(f.type).endswith(" | None") else ()) for f in fields(RunRecord)}
_REQUIRED = {f.name for f in fields(RunRecord) if f.default is MISSING and f.default_factory is MISSING}


def decode_record(data: str) -> RunRecord:
    """A stored record, or ValueError saying what is wrong with it (a damaged file, a hand edit).
    Keys this version does not know are left out: a newer ftcluster may have written them."""
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    problems = [f"{name} missing" for name in sorted(_REQUIRED - set(obj))]
    problems += [f"{name} is {type(obj[name]).__name__}" for name, types in _FIELD_TYPES.items()
                 if name in obj and (not isinstance(obj[name], types) or isinstance(obj[name], bool))]
    if problems:
        raise ValueError(", ".join(problems))
    return RunRecord(**{k: v for k, v in obj.items() if k in _FIELD_TYPES})


_warned: set[str] = set()   # damaged records already reported by this process


_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    data TEXT NOT NULL
)
"""


class RunStore:
    def __init__(self, path: Path | None = None):
        self.path = path or self.default_path()
        self.damaged: dict[str, str] = {}   # run id -> what is wrong with its record
        # The store names every run folder and endpoint: yours alone, whatever the umask.
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as exc:
            raise self._unusable(exc.strerror or str(exc)) from None
        with self._db() as db:
            db.execute(_SCHEMA)

    @staticmethod
    def default_path() -> Path:
        return state_dir() / "runs.sqlite"

    @classmethod
    def exists(cls) -> bool:
        """Whether the store is there already (a dry run reads it then, and never makes it)."""
        return cls.default_path().is_file()

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        # Several ftcluster processes may touch the store at once (launch + status).
        try:
            db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._unusable(str(exc)) from None
        try:
            yield db
        except sqlite3.Error as exc:   # a full disk, a damaged file, a lock held past the timeout
            raise self._unusable(str(exc)) from None
        finally:
            db.close()

    def _unusable(self, why: str) -> UserError:
        return UserError(f"the run store {self.path} cannot be used: {why}", field="FTCLUSTER_STATE_DIR",
                         hint="free space there, move a damaged file aside (the run folders stay), or point "
                              "FTCLUSTER_STATE_DIR at another folder")

    def add(self, rec: RunRecord) -> None:
        with self._db() as db:
            db.execute("INSERT INTO runs VALUES (?, ?, ?)", (rec.run_id, rec.created, json.dumps(rec.to_dict())))

    def remove(self, run_id: str) -> None:
        with self._db() as db:
            db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))

    def update(self, rec: RunRecord, **changes: Any) -> RunRecord:
        new = replace(rec, **changes)
        with self._db() as db:
            db.execute("UPDATE runs SET data = ? WHERE run_id = ?", (json.dumps(new.to_dict()), rec.run_id))
        return new

    def all(self) -> Iterator[RunRecord]:
        """The runs, oldest first; a damaged record is left out (with a warning once), so one
        bad row does not take every command with it."""
        with self._db() as db:
            rows = db.execute("SELECT run_id, data FROM runs ORDER BY created").fetchall()
        for run_id, data in rows:
            rec = self._decode(run_id, data)
            if rec is not None:
                yield rec

    def exact(self, run_id: str) -> RunRecord | None:
        """The run with exactly this id, or None (also when its record is damaged)."""
        with self._db() as db:
            row = db.execute("SELECT data FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return self._decode(run_id, row[0]) if row else None

    def _decode(self, run_id: str, data: str) -> RunRecord | None:
        try:
            return decode_record(data)
        except ValueError as exc:
            self.damaged[run_id] = str(exc)
        if run_id not in _warned:
            _warned.add(run_id)
            print(f"warning: the run store's record of {run_id} is damaged ({self.damaged[run_id]}); it is "
                  "left out. Its run folder is untouched: give the folder's path to a command "
                  "(`ftcluster status PATH`) to record the run again.", file=sys.stderr)
        return None

    def get(self, key: str | None) -> RunRecord:
        """A run by id, unique id prefix or Slurm job id; the newest run when key is None."""
        runs = list(self.all())
        if not runs:
            adopted = self._adopt(key) if key else None
            if adopted is not None:
                return adopted
            raise UserError("no runs recorded yet", hint="start one with `ftcluster launch`")
        if key is None:
            # A replica set's members are the set's: the newest run of one's own choosing.
            return [r for r in runs if r.replica_of is None][-1] if any(r.replica_of is None for r in runs) \
                else runs[-1]
        if not key.strip():
            raise UserError("an empty run id matches no run", hint="give a run id, or none for the newest run")
        exact = [r for r in runs if r.run_id == key or r.job_id == key]
        if exact:
            return exact[-1]
        prefix = [r for r in runs if r.run_id.startswith(key)]
        if len(prefix) == 1:
            return prefix[0]
        if prefix:
            raise UserError(f"run {key!r} is ambiguous ({len(prefix)} runs match)", hint="give more of the id")
        adopted = self._adopt(key)
        if adopted is not None:
            return adopted
        if key in self.damaged:
            raise UserError(f"the record of run {key} is damaged ({self.damaged[key]})", field="RUN",
                            hint="give the run's folder instead (<workspace>/runs/RUN): it records the run again")
        raise UserError(f"no run {key!r}", hint="see `ftcluster list`, or give a run folder's path")

    def _adopt(self, key: str) -> RunRecord | None:
        """A run folder's path (a run submitted by hand): its record, kept from now on."""
        folder = Path(key).expanduser()
        try:
            if not folder.is_dir():
                return None
        except OSError:   # a name too long to be a path (ENAMETOOLONG), one behind a folder not ours
            return None
        # import cycle: ftcluster.run.folder imports this module
        from ftcluster.run.folder import record_of_folder

        rec = record_of_folder(folder)
        if rec is None:
            raise UserError(f"{folder} is no run folder (scripts/job.json missing, or not as launch writes it)",
                            field="RUN", hint="give a run id, or the folder `render --out` wrote")
        known = self.exact(rec.run_id)
        if known is None:
            if rec.run_id in self.damaged:   # the folder's record replaces the damaged one
                self.remove(rec.run_id)
                del self.damaged[rec.run_id]
            self.add(rec)
            return rec
        if Path(known.run_dir).resolve() != folder.resolve():
            raise UserError(f"run id {rec.run_id} is recorded already, for {known.run_dir}", field="RUN",
                            hint="render the folder again with another --run-id")
        # Submitted (again) since it was recorded. A local job's id is read afresh from its pid
        # (local:PID@START): once it has ended, the same job reads as local:PID@0.
        if rec.job_id and rec.job_id.partition("@")[0] != (known.job_id or "").partition("@")[0]:
            return self.update(known, job_id=rec.job_id, status=rec.status)
        return known


# The run id names the run folder, Slurm jobs, containers and server ids; a long model name is
# cut to this length with a hash of the whole name kept, so distinct names stay distinct.
RUN_NAME_MAX = 40


def run_name(model_name: str) -> str:
    """The model-name part of a run id: plain characters, at most RUN_NAME_MAX of them."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", model_name).lstrip("._-") or "run"
    if len(name) <= RUN_NAME_MAX:
        return name
    import hashlib   # here: loading OpenSSL costs every `status`/`list` a few ms, for long names only

    digest = hashlib.sha256(model_name.encode()).hexdigest()[:8]
    return f"{name[:RUN_NAME_MAX - 9].rstrip('._-')}-{digest}"


def new_run_id(model_name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{run_name(model_name)}-{stamp}-{os.urandom(2).hex()}"
