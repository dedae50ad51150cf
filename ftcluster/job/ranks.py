"""What the ranks left in the run folder (state/rank<R>.*, their server logs) and rank 0's HTTP
answers: the facts readiness and failure messages are made of. Reads only; no process."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Set, Tuple

from .names import FILES
from .text import last_line

if TYPE_CHECKING:
    import http.client

# glog's error lines ("E<MMDD> <time> ..."), less what a CPU-only server always logs.
ERROR_LINE = re.compile(r"^E[0-9]{4} [0-9:.]+ ")
HARMLESS_ERRORS = re.compile(r"CudaDriverHelper|NVML|DCGM|pinned")
LAST_ERROR_BYTES = 64 << 10


class RankLines:
    """A file each rank appends a line to (rank_server.sh), read on a descriptor held open, the
    followers' way: a read() costs no path lookup, where a look at every rank's own file costs
    one per rank (at 512 nodes, four times a second, thousands a second on a shared filesystem).
    Opened for append, which creates it, and read from its end: what was there is an earlier
    incarnation's, so it is opened before the servers of an incarnation start."""

    def __init__(self, state: str, name: str):
        self.f = open(os.path.join(state, name), "a+")
        self.f.seek(0, os.SEEK_END)
        self.partial = ""

    def new(self) -> List[List[str]]:
        """The words of each whole line written since the last look."""
        text = self.partial + self.f.read()
        lines = text.split("\n")
        self.partial = lines.pop()   # a line still being written
        return [parts for parts in (line.split() for line in lines) if parts and parts[0].isdigit()]

    def close(self) -> None:
        self.f.close()


def parse_exit(text: str) -> Optional[Tuple[str, float, str]]:
    """A rank's exit record, "CODE EPOCH died|stopped": (code, epoch, how). None for a record
    not whole: the wrapper's `>` empties the file before its one write, so a reader may see it
    empty, and a wrapper killed in between leaves it so -- no exit of its own was recorded."""
    parts = text.split()
    if len(parts) != 3 or not parts[0].isdigit() or parts[2] not in ("died", "stopped"):
        return None
    try:
        return parts[0], float(parts[1]), parts[2]
    except ValueError:
        return None


class ExitWatch(RankLines):
    """state/exits: "RANK CODE EPOCH died|stopped INCARNATION" per rank exit."""

    def __init__(self, state: str):
        super().__init__(state, FILES.rank_exits)
        self.exited: Set[int] = set()   # the ranks whose exit line was read
        self.dead: Set[int] = set()     # of them, those whose server ended unasked

    def _take(self) -> List[List[str]]:
        lines = self.new()
        self.exited.update(int(parts[0]) for parts in lines)
        self.dead.update(int(parts[0]) for parts in lines if parts[3:4] == ["died"])
        return lines

    def died(self) -> Optional[Tuple[int, str]]:
        """(rank, exit code) of the first rank that died since the last look, or None."""
        for parts in self._take():
            if parts[3:4] == ["died"]:
                return int(parts[0]), parts[1]
        return None

    def any_died(self) -> bool:
        """A rank's server ended unasked in this incarnation."""
        self._take()
        return bool(self.dead)

    def all_exited(self, ranks: int) -> bool:
        """Every rank 0..ranks-1 wrote its exit line (each wrapper, on its node, after its server)."""
        self._take()
        return len(self.exited) >= ranks


class LoadWatch(RankLines):
    """state/loads: "RANK EPOCH INCARNATION" once a rank's server is inside model load (FT's
    ranks != 0 never leave it; rank_server.sh writes it the moment FT's line passes)."""

    def __init__(self, state: str, nodes: int):
        super().__init__(state, FILES.rank_loads)
        self.nodes = nodes
        self.loaded: Set[int] = set()

    def _take_new(self) -> None:
        self.loaded.update(int(parts[0]) for parts in self.new())

    def has(self, rank: int) -> bool:
        self._take_new()
        return rank in self.loaded

    def not_loaded(self) -> List[int]:
        """The ranks != 0 whose server has not reached model load yet."""
        self._take_new()
        return [r for r in range(1, self.nodes) if r not in self.loaded]


class RankFiles:
    def __init__(self, state: str, logs: str, nodes: int):
        self.state, self.logs, self.nodes = state, logs, nodes

    def path(self, rank: int, what: str) -> str:
        return os.path.join(self.logs if what == "stdout" else self.state, FILES.rank(rank, what))

    def server_log(self, rank: int) -> str:
        return os.path.join(self.logs, FILES.server_log(rank))

    def read(self, rank: int, what: str) -> Optional[str]:
        try:
            with open(self.path(rank, what)) as f:
                return f.read()
        except OSError:
            return None

    def exists(self, rank: int, what: str) -> bool:
        return os.path.exists(self.path(rank, what))

    def node(self, rank: int) -> str:
        return (self.read(rank, "host") or "").strip() or "?"

    def hosts(self) -> List[str]:
        """Each rank's node, rank 0 first ("?" where none is recorded)."""
        return [self.node(r) for r in range(self.nodes)]

    def exit(self, rank: int) -> Optional[Tuple[str, float, str]]:
        """state/rank<R>.exit (rank_server.sh): (code, time, how), or None while there is none."""
        text = self.read(rank, "exit")
        return None if text is None else parse_exit(text)

    def first_died(self) -> Optional[int]:
        """The rank that died first, or None. Ranks that were asked to stop are not a cause."""
        best: Optional[Tuple[float, int]] = None
        for rank in range(self.nodes):
            ex = self.exit(rank)
            if ex is not None and ex[2] == "died" and (best is None or ex[1] < best[0]):
                best = (ex[1], rank)
        return None if best is None else best[1]

    def first_with_error(self) -> Optional[Tuple[int, str]]:
        """When the whole step was killed (Slurm's PMIx plugin aborts a step whose MPI process
        exits without MPI_Finalize, wrappers included), no rank wrote an exit: the rank whose
        server log holds the earliest error line is the cause. (rank, line)."""
        best: Optional[Tuple[str, int, str]] = None
        for rank in range(self.nodes):
            try:
                with open(self.server_log(rank), errors="replace") as f:
                    line = next((ln.rstrip("\n") for ln in f
                                 if ERROR_LINE.match(ln) and not HARMLESS_ERRORS.search(ln)), None)
            except OSError:
                continue
            if line is not None and (best is None or line[1:21] < best[0]):
                best = (line[1:21], rank, line)
        return None if best is None else (best[1], best[2])

    def last_error(self, rank: int) -> Optional[str]:
        """The message of the last error line in the rank's server log (its last 64 KiB), as
        Triton wrote it after the glog prefix: what a server that exited at start-up said of
        why ("failed to start GRPC service: ... already in use")."""
        try:
            with open(self.server_log(rank), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - LAST_ERROR_BYTES))
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            if ERROR_LINE.match(line) and not HARMLESS_ERRORS.search(line):
                said = line.partition("] ")[2].strip() or line
                said = said[1:-1].strip() if len(said) > 1 and said[0] == said[-1] == '"' else said
                # A Python backend's error comes with its traceback, its newlines escaped: the
                # error's own line is the cause.
                return said.split("\\n", 1)[0].strip()
        return None

    def last_words(self) -> str:
        """Each rank's last server-log line and how long ago its log last grew."""
        said = []
        now = time.time()
        for rank in range(self.nodes):
            path = self.server_log(rank)
            try:
                age = now - os.path.getmtime(path)
                with open(path, "rb") as f:
                    f.seek(max(0, os.path.getsize(path) - 4096))
                    last = last_line(f.read().decode(errors="replace")).strip()[:160] or "(empty)"
            except OSError:
                said.append(f"rank {rank}: no log")
                continue
            said.append(f"rank {rank} on {self.node(rank)}, {age:.0f} s ago: {last}")
        return "; ".join(said)

    def tail(self, rank: int, lines: int = 20) -> str:
        """The last lines of the rank's server log and its wrapper's output, as `tail` shows two
        files; only files that hold a line ("" when none does: it ended before its server said anything)."""
        out = []
        for path in (self.server_log(rank), self.path(rank, "stdout")):
            try:
                with open(path, errors="replace") as f:
                    text = f.read().splitlines()[-lines:]
            except OSError:
                continue
            if any(line.strip() for line in text):
                out.append(f"==> {path} <==")
                out.extend(text)
        return "\n".join(out)


class Via(NamedTuple):
    """What the job's requests to rank 0 carry: nothing to Triton's own ports; through the run's
    proxy (where it runs away from the job: ssh + Docker) the run's token, over TLS where the
    proxy serves it."""

    token: str = ""
    tls: bool = False

    def headers(self) -> Optional[Dict[str, str]]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else None

    def connection(self, host: str, port: int, timeout: float) -> http.client.HTTPConnection:
        """TLS is only ever asked of the run's own proxy, which the job saw take its ports and
        whose certificate names the endpoint's host, not necessarily what the job dials (the
        loopback): not verified. http.client (with ssl, 10-15 ms) is imported at the first
        request, not on the way to the servers' start."""
        # job start-up: http.client (with ssl, 10-15 ms) at the first request (see the docstring)
        import http.client

        if self.tls:
            import ssl  # job start-up: as http.client, at the first request

            return http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl._create_unverified_context())
        return http.client.HTTPConnection(host, port, timeout=timeout)


DIRECT = Via()


def http_get(host: str, port: int, path: str, timeout: float = 2.0, via: Via = DIRECT) -> Optional[bytes]:
    """The body of GET http://HOST:PORT/PATH (https:// where `via` asks for TLS, unverified: see
    Via), with what `via` carries, when the answer is 200, else None."""
    # job start-up: http.client (with ssl, 10-15 ms) at the first request (see the docstring)
    import http.client

    conn = via.connection(host, port, timeout)
    try:
        conn.request("GET", path, headers=via.headers() or {})
        resp = conn.getresponse()
        body = resp.read()
        return body if resp.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def rank0_ready(host: str, port: int, server_id: str, model: str, via: Via = DIRECT) -> bool:
    """Rank 0 is ours and serving: /v2 names OUR --id (not a stale server on the port), and every
    model, the served one included, is ready."""
    if http_get(host, port, "/v2/health/ready", via=via) is None:
        return False
    meta = http_get(host, port, "/v2", via=via)
    try:
        if meta is None or json.loads(meta).get("name") != server_id:
            return False
    except ValueError:
        return False
    return http_get(host, port, f"/v2/models/{model}/ready", via=via) is not None


# Earlier incarnations kept in logs/: a run that restarts for days keeps the last few only.
KEEP_INCARNATIONS = 5


def cut_log(path: str, max_bytes: int) -> bool:
    """Bounds a long-lived process's log: one over max_bytes is copied to <log>.1 (replacing the
    one before) and emptied in place, as logrotate's copytruncate does -- its writer appends
    (O_APPEND), so its next line lands at the new start. The log then takes at most twice
    max_bytes. True when it was cut."""
    try:
        if os.path.getsize(path) <= max_bytes:
            return False
        shutil.copyfile(path, path + ".1")
        os.truncate(path, 0)
    except OSError:
        return False
    return True


def cut_words(whose: str, name: str, max_bytes: int) -> str:
    """What the job says of a log that cut_log cut: `whose` log, named `name` in logs/."""
    return f"ftcluster: {whose} log passed {max_bytes / (1 << 20):g} MiB: moved to {name}.1"


def cut_server_logs(ranks: RankFiles, max_bytes: int) -> List[int]:
    """Bounds a serving run's server logs (cut_log: rank_server.sh writes them with >>): each
    rank's then takes at most twice max_bytes. The ranks cut, in order."""
    return [r for r in range(ranks.nodes) if cut_log(ranks.server_log(r), max_bytes)]


def keep_incarnation(logs: str, state: str, nodes: int, n: int) -> str:
    """Move incarnation n's rank files (state/rank<R>.*, logs/rank<R>.stdout), server logs, the
    local mpirun's log and the probes' health into logs/incarnation-<n>/, so the next incarnation
    starts from none (its readiness reads them); the oldest beyond KEEP_INCARNATIONS go."""
    ranks = RankFiles(state, logs, nodes)
    dest = os.path.join(logs, FILES.incarnation_dir.format(n=n))
    os.makedirs(dest, exist_ok=True)
    moving = [ranks.path(r, what) for r in range(nodes) for what in FILES.RANK_FILES]
    moving += [log for r in range(nodes) for log in (ranks.server_log(r), ranks.server_log(r) + ".1")]
    moving += [os.path.join(logs, FILES.mpirun_log), os.path.join(state, FILES.health)]
    for path in moving:
        if os.path.exists(path):
            os.replace(path, os.path.join(dest, os.path.basename(path)))
    old = os.path.join(logs, FILES.incarnation_dir.format(n=n - KEEP_INCARNATIONS))
    if n >= KEEP_INCARNATIONS and os.path.isdir(old):
        shutil.rmtree(old, ignore_errors=True)
    return dest


class LoadProgress(NamedTuple):
    """A loading rank's figures (state/rank<R>.progress, written by its wrapper on its node)."""

    moved: float      # when a figure last changed (the node's clock)
    now: float        # when the wrapper last looked (the node's clock)
    read: int         # bytes its server and the server's children have read
    log: int          # bytes of its server log
    gpu_mib: int      # its node's GPU memory in use

    @property
    def still_for(self) -> float:
        return max(0.0, self.now - self.moved)

    def words(self) -> str:
        return f"read {size_words(self.read)}, log {size_words(self.log)}" + (
            f", GPU memory {self.gpu_mib} MiB" if self.gpu_mib else "")


def load_progress(text: Optional[str]) -> Optional[LoadProgress]:
    parts = (text or "").split()
    if len(parts) != 5 or not all(p.isdigit() for p in parts):
        return None
    moved, now, read, log, gpu = (int(p) for p in parts)
    return LoadProgress(float(moved), float(now), read, log, gpu)


def size_words(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
