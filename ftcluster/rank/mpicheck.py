"""MPI world check, run on every rank through the same srun/mpirun path as the servers.

    python3 scripts/mpicheck.py --nodes N [--tritonserver PATH] [--rank0-host HOST] [--out JSON]
        [--backends NAME,...] [--backend-directory DIR]

Each rank reports who and where it is and what it would run; rank 0 gathers the reports,
checks them (world size, one rank per node, rank 0's node, identical binaries and MPI
library, every backend library the model needs in the image), then a broadcast and a gather must finish within a timeout. Exit 0 when every check
passed. It runs inside the user's image, which has neither ftcluster nor mpi4py: the launch
copies this file and ctmpi.py (ctypes on the image's own libmpi) into the run folder, and both
need only Python >= 3.8's standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

try:
    from ftcluster.rank import ctmpi
    from ftcluster.rank.env import which_in_image
except ImportError:  # inside the user's image: ctmpi.py and rank_env.py lie beside this file
    import ctmpi  # type: ignore[no-redef]
    from rank_env import which_in_image  # type: ignore[no-redef]

RANK_VARS = ("SLURM_PROCID", "SLURM_NODEID", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_RANK",
             "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "CUDA_VISIBLE_DEVICES")


@dataclass
class RankReport:
    rank: int
    size: int
    host: str
    mpi_library: str
    env: dict[str, str]
    tritonserver: str | None
    tritonserver_sha256: str | None
    # The backend libraries the run's models need, as found: name -> (path, sha256).
    backend_libraries: dict[str, tuple[str, str | None]]
    gpus: int | None
    # Backends this rank's image lacks: (backend, the paths looked for).
    missing_backends: list[tuple[str, list[str]]] = field(default_factory=list)


@dataclass
class CheckResult:
    ok: bool
    problems: list[str] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    bcast_ms: float | None = None
    gather_ms: float | None = None


def _sha256(path: str | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _resolve(binary: str | None) -> str | None:
    if not binary:
        return None
    found = which_in_image(binary)
    return os.path.realpath(found) if found else None


# Triton's own default --backend-directory.
TRITON_BACKENDS = "/opt/tritonserver/backends"


def backend_dirs(tritonserver: str | None, backend_directory: str | None) -> list[str]:
    """Where the server looks for its backends: the --backend-directory it is given; else the
    backends/ beside its bin/ (an image's /opt/tritonserver, a wrapper's bundle), then Triton's
    default."""
    if backend_directory:
        return [backend_directory]
    dirs = [os.path.join(os.path.dirname(os.path.dirname(tritonserver)), "backends")] if tritonserver else []
    return dirs + [d for d in (TRITON_BACKENDS,) if d not in dirs]


def backend_library(name: str, dirs: list[str]) -> str | None:
    """Where Triton finds backend `name`'s library: the first <dir>/<name>/libtriton_<name>.so."""
    for d in dirs:
        lib = os.path.join(d, name, f"libtriton_{name}.so")
        if os.path.isfile(lib):
            return lib
    return None


def missing_backends(backends: list[str], dirs: list[str]) -> list[tuple[str, list[str]]]:
    """The backends none of `dirs` holds, each with the paths looked for: Triton loads
    <dir>/<name>/libtriton_<name>.so (or a Python-based backend's model.py); without it the
    model fails only at load ("unable to find backend library for backend ...")."""
    missing = []
    for name in backends:
        paths = [os.path.join(d, name, f"libtriton_{name}.so") for d in dirs]
        if not any(os.path.isfile(p) or os.path.isfile(os.path.join(os.path.dirname(p), "model.py")) for p in paths):
            missing.append((name, paths))
    return missing


def _gpus() -> int | None:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([d for d in vis.split(",") if d.strip()])
    return None


def local_report(rank: int, size: int, mpi_library: str, binary: str | None, backends: list[str] | None = None,
                 backend_directory: str | None = None) -> RankReport:
    exe = _resolve(binary)
    dirs = backend_dirs(exe, backend_directory)
    libraries = {name: (lib, _sha256(lib)) for name in backends or [] if (lib := backend_library(name, dirs))}
    return RankReport(
        rank=rank, size=size, host=socket.gethostname(), mpi_library=mpi_library.strip().splitlines()[0],
        env={k: os.environ[k] for k in RANK_VARS if k in os.environ},
        tritonserver=exe, tritonserver_sha256=_sha256(exe), backend_libraries=libraries,
        gpus=_gpus(), missing_backends=missing_backends(backends or [], dirs),
    )


def check_reports(reports: list[RankReport], nodes: int, rank0_host: str | None, binary: str | None) -> list[str]:
    """Problems found in the gathered reports, each naming the rank, node and fix. Pure."""
    problems = []
    size = reports[0].size if reports else 0
    if size != nodes:
        problems.append(f"world size is {size} but the plan has {nodes} node(s): one rank per node is needed "
                        "(check --ntasks-per-node=1 and the MPI plugin: `srun --mpi=list`)")
    by_host: dict[str, list[int]] = {}
    for r in reports:
        by_host.setdefault(r.host, []).append(r.rank)
    for host, ranks in sorted(by_host.items()):
        if len(ranks) > 1:
            problems.append(f"ranks {ranks} share node {host}: expected one rank per node")
    if rank0_host and reports and reports[0].host.split(".")[0] != rank0_host.split(".")[0]:
        problems.append(f"rank 0 runs on {reports[0].host}, but readiness and the client use {rank0_host}")
    ref = reports[0] if reports else None
    for r in reports[1:]:
        assert ref is not None
        if r.mpi_library != ref.mpi_library:
            problems.append(f"rank {r.rank} on {r.host} uses MPI {r.mpi_library!r}, rank 0 {ref.mpi_library!r}")
        if r.tritonserver_sha256 != ref.tritonserver_sha256:
            problems.append(f"rank {r.rank} on {r.host}: tritonserver {r.tritonserver} differs from rank 0's "
                            f"{ref.tritonserver} (sha256 {str(r.tritonserver_sha256)[:12]} vs "
                            f"{str(ref.tritonserver_sha256)[:12]}): use the same image/installation everywhere")
        for name, (lib, sha) in sorted(r.backend_libraries.items()):
            theirs = ref.backend_libraries.get(name)
            if theirs is not None and theirs[1] != sha:
                problems.append(f"rank {r.rank} on {r.host}: backend {name!r} library {lib} differs from rank 0's "
                                f"{theirs[0]} (sha256 {str(sha)[:12]} vs {str(theirs[1])[:12]}): use the same "
                                "image/installation everywhere")
    if binary:
        for r in reports:
            if r.tritonserver is None:
                problems.append(f"rank {r.rank} on {r.host}: tritonserver {binary!r} not found")
    for r in reports:
        for name, paths in r.missing_backends:
            problems.append(f"rank {r.rank} on {r.host}: no backend library for backend {name!r} (looked for "
                            f"{' and '.join(paths)}): the model needs it at load; use an image with that backend "
                            "(or give its folder with --backend-directory in server.extra_args)")
    return problems


def _launcher_rank_number() -> str | None:
    """This process's rank as its launcher numbered it (MPI cannot say when it did not start);
    None where no launcher did."""
    return next((os.environ[v] for v in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
                 if os.environ.get(v, "").isdigit()), None)


def _launcher_rank() -> str:
    number = _launcher_rank_number()
    return f"rank {number}" if number is not None else "a rank"


def _own_shm(prefix: str | None) -> str | None:
    """Open MPI's shared-memory segments (vader in 4.x, sm in 5.x) and its session folder (in
    $TMPDIR: /tmp/ompi.HOST.UID, which a singleton -- a world that could not form -- leaves
    behind) in a folder of this rank's under the run's /dev/shm prefix, as the servers' are: a
    check that is aborted or killed leaves them there, where the teardown and a later run's
    ranks find them; in the default places they stay for good. The environment's own backing
    directory wins."""
    if not prefix or any(v in os.environ for v in _BACKING):
        return None
    folder = f"{prefix}r{_launcher_rank_number() or '0'}+check+mpi"
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return None
    for var in (*_BACKING, "TMPDIR"):
        os.environ[var] = folder
    return folder


_BACKING = ("OMPI_MCA_btl_vader_backing_directory", "OMPI_MCA_btl_sm_backing_directory")


def _launched_tasks() -> int | None:
    """How many tasks the launcher started (mpirun's count first: it may run inside a step)."""
    for var in ("OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def _no_mpi_wiring() -> str | None:
    """Why srun gave this rank no way to find the others, or None. Open MPI's MPI_Init exits the
    process itself in that case (`OPAL ERROR: Unreachable`), so it must be caught before."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "1")
    if not tasks.isdigit() or int(tasks) < 2:
        return None
    if any(v in os.environ for v in ("PMIX_RANK", "PMI_RANK", "PMI_FD", "OMPI_COMM_WORLD_SIZE")):
        return None
    plugin = os.environ.get("SLURM_MPI_TYPE", "none")
    return (f"srun started {tasks} tasks with --mpi={plugin}, which gives them no PMI to meet through: "
            "set mpi: to a plugin the image's MPI supports (pmix for Open MPI 4; `srun --mpi=list`)")


def _with_timeout(world: Any, fn: Any, timeout: float, what: str) -> float:
    """Run an MPI collective; abort the whole world when it hangs (a broken fabric)."""
    done = threading.Event()

    def watchdog() -> None:
        if not done.wait(timeout):
            sys.stderr.write(f"PROBLEM: rank {world.rank} on {socket.gethostname()}: {what} did not finish "
                             f"within {timeout}s; aborting\n")
            sys.stderr.flush()
            world.abort(3)

    threading.Thread(target=watchdog, daemon=True).start()
    t = time.perf_counter()
    fn()
    done.set()
    return (time.perf_counter() - t) * 1000


def _gather_json(world: Any, obj: Any) -> list[Any] | None:
    """Every rank's JSON-able object at rank 0 (blocks padded to the longest)."""
    mine = json.dumps(obj).encode()
    sizes = world.gather_bytes(len(mine).to_bytes(8, "little"))
    longest = max(int.from_bytes(b, "little") for b in sizes) if sizes else 0
    longest = int.from_bytes(world.bcast_bytes(longest.to_bytes(8, "little")), "little")
    blocks = world.gather_bytes(mine.ljust(longest, b" "))
    return None if blocks is None else [json.loads(b) for b in blocks]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mpicheck.py", description=(__doc__ or "").split("\n")[1])
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--tritonserver", default=None)
    ap.add_argument("--rank0-host", default=None)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--shm-prefix", default=None, help="the run's /dev/shm prefix, for Open MPI's segments")
    ap.add_argument("--backends", default="", help="backends the model needs (comma-separated)")
    ap.add_argument("--backend-directory", default=None, help="the server's --backend-directory")
    args = ap.parse_args(argv)
    shm = _own_shm(args.shm_prefix)
    try:
        return _check(args)
    finally:
        if shm:
            shutil.rmtree(shm, ignore_errors=True)


def _check(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    unwired = _no_mpi_wiring()
    if unwired:
        print(f"PROBLEM: {_launcher_rank()} on {socket.gethostname()} cannot join a world: {unwired}", file=sys.stderr)
        return 2
    try:
        world = ctmpi.World()
    except ctmpi.MPIError as exc:
        print(f"PROBLEM: {_launcher_rank()} on {socket.gethostname()} cannot start MPI: {exc}", file=sys.stderr)
        return 2
    rank, size = world.rank, world.size
    launched = _launched_tasks()
    if launched and size != launched:
        # Singletons (an MPI that does not speak the launcher's PMI) would each pass alone.
        how = f" (--mpi={os.environ['SLURM_MPI_TYPE']})" if "SLURM_MPI_TYPE" in os.environ else ""
        print(f"PROBLEM: {_launcher_rank()} on {socket.gethostname()}: its MPI made a world of {size}, but "
              f"{launched} tasks were started{how}: the image's MPI does not speak the launcher's PMI; set mpi: "
              "to one it does (pmix for Open MPI 4; `srun --mpi=list`)", file=sys.stderr)
        return 2
    report = local_report(rank, size, world.library_version(), args.tritonserver,
                          [b for b in args.backends.split(",") if b], args.backend_directory)
    box: dict[str, Any] = {}
    bcast_ms = _with_timeout(world, lambda: box.update(token=world.bcast_bytes(b"ftcluster" if rank == 0 else None)),
                             args.timeout, "the broadcast")
    gather_ms = _with_timeout(world, lambda: box.update(reports=_gather_json(world, asdict(report))),
                              args.timeout, "the gather")
    if rank != 0:
        world.finalize()
        return 0
    reports = box["reports"]
    assert reports is not None
    parsed = [RankReport(**r) for r in reports]
    problems = check_reports(parsed, args.nodes, args.rank0_host, args.tritonserver)
    if box["token"] != b"ftcluster":
        problems.append(f"the broadcast delivered {box['token']!r}")
    result = CheckResult(ok=not problems, problems=problems, ranks=[asdict(r) for r in parsed],
                         seconds=round(time.perf_counter() - t0, 3), bcast_ms=round(bcast_ms, 3),
                         gather_ms=round(gather_ms, 3))
    _print_table(result)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(asdict(result), fh, indent=2)
    world.finalize()
    return 0 if result.ok else 1


def _print_table(result: CheckResult) -> None:
    print(f"{'rank':>4}  {'host':<16} {'tritonserver sha256':<14} {'mpi':<30}")
    for r in result.ranks:
        sha = (r["tritonserver_sha256"] or "-")[:12]
        print(f"{r['rank']:>4}  {r['host']:<16} {sha:<14} {r['mpi_library'][:30]:<30}")
    print(f"broadcast {result.bcast_ms} ms, gather {result.gather_ms} ms, check took {result.seconds} s")
    for p in result.problems:
        print(f"PROBLEM: {p}")
    print("MPI check " + ("passed" if result.ok else "FAILED"))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
