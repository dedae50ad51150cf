"""The slurm.conf of a test cluster (Slurm 22.05, no cgroups, no database)."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from .netns import Net

SYSTEM_CONF = Path("/etc/slurm/slurm.conf")  # what plain srun/sbatch read
CPUS_PER_NODE = 8  # more than the real cores: allowed by SlurmdParameters=config_overrides


def slurmctld_port(net: Net) -> int:
    # Distinct per cluster: slurmctld listens in the shared root namespace.
    return 6800 + net.octet


def render(net: Net, root: Path, munge_socket: Path, plugstack: Path | None = None) -> str:
    """plugstack: a SPANK plugstack file (Pyxis) for slurmd, slurmstepd and every client."""
    host = socket.gethostname().split(".")[0]
    nodes = f"{net.prefix}[1-{net.nodes}]" if net.nodes > 1 else f"{net.prefix}1"
    lines = [
        f"ClusterName={net.tag}",
        f"SlurmctldHost={host}({net.gateway})",
        f"SlurmctldPort={slurmctld_port(net)}",
        "SlurmdPort=6818",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # Our own munged: never touch a system munged on the default socket. cred_expire is also
        # how long a requeued job waits before it may start again (120 s by default; 15 s here,
        # as SlurmdTimeout below, so that the lost-node tests wait less for Slurm).
        f"AuthInfo=socket={munge_socket},cred_expire=15",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        # Nodes share /tmp; pmix keeps per-node state under TmpFS.
        f"TmpFS={root}/tmp/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",  # no systemd or cgroups needed
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerParameters=batch_sched_delay=0",  # batch jobs start at once
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",  # `sacct -c` without a database
        f"JobCompLoc={root}/log/jobcomp.txt",
        "MailProg=/bin/true",
        "SlurmdTimeout=20",   # 300 s by default
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=30",
    ]
    if plugstack is not None:
        lines.append(f"PlugStackConfig={plugstack}")
    for i, name in enumerate(net.names, 1):
        lines.append(
            f"NodeName={name} NodeAddr={net.ip(i)} NodeHostname={name} "
            f"CPUs={CPUS_PER_NODE} CoresPerSocket={CPUS_PER_NODE} ThreadsPerCore=1 "
            "RealMemory=2000 State=UNKNOWN"
        )
    lines.append(f"PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP")
    # Only one node: lets tests ask for more nodes than a partition has.
    lines.append(f"PartitionName=small Nodes={net.prefix}1 MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def is_ours(header: str) -> bool:
    """Whether /etc/slurm/slurm.conf is the one written for the cluster with this header."""
    try:
        return SYSTEM_CONF.read_text().startswith(f"# {header}")
    except OSError:
        return False


def install_system(text: str, header: str, backup: Path) -> None:
    """Write /etc/slurm/slurm.conf, first keeping a copy of a file that is not ours."""
    if SYSTEM_CONF.exists() and not is_ours(header) and not backup.exists():
        shutil.copy2(SYSTEM_CONF, backup)
    SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
    SYSTEM_CONF.write_text(text)


def restore_system(header: str, backup: Path) -> None:
    """Put back what install_system replaced (or remove our file if there was none)."""
    if is_ours(header):
        if backup.exists():
            shutil.copy2(backup, SYSTEM_CONF)
        else:
            SYSTEM_CONF.unlink()
    backup.unlink(missing_ok=True)
