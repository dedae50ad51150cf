"""`tunnel`: a workstation port forwarded through the login node to a run's endpoint."""

from __future__ import annotations

import click

from ftcluster.cli import cli
from ftcluster.cli.output import complete_run
from ftcluster.cli.numbers import DAY, seconds, tcp_port
from ftcluster.errors import UserError

CHECK_S = 30.0   # one `status` on the login node every half minute; the tunnel costs nothing idle


@cli.command("tunnel")
@click.argument("run", required=False, shell_complete=complete_run)
@click.option("--local-port", type=tcp_port(), default=None,
              help="The port on this machine (default: the endpoint's own port).")
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True)
@click.option("--remote-port", type=tcp_port(), default=None,
              help="Another port of rank 0's node (default: the endpoint's; gRPC: the spec's ports.grpc).")
@click.option("--check-every", type=seconds(DAY), default=CHECK_S, show_default=True,
              help="Seconds between the login node's answers to: does the run still serve there?")
def tunnel_cmd(run: str | None, local_port: int | None, protocol: str, remote_port: int | None,
               check_every: float) -> None:
    """Forward a local port through the login node to a run's endpoint (default: the newest run).

    For a run launched through `login_host`: the endpoint on the cluster's network is reached
    from this machine as 127.0.0.1:PORT, over the same SSH connection rules (your keys, agent and
    known_hosts). A run that hands over (its time limit, a lost node) is followed to its
    successor on the same local port. Ends on Ctrl-C, and by itself when the service ends.

    \b
    Example:
      ftcluster tunnel gpt-20261121-101500-ab12 --local-port 18000 &
      FTCLUSTER_TOKEN=$(ftcluster token gpt-20261121-101500-ab12) \\
          ftcluster client identity --url 127.0.0.1:18000
    """
    # startup: the specs (pydantic) and ssh only when the command runs, not for its --help
    from ftcluster.spec.load import load_cluster
    from ftcluster.run.store import RunStore
    from ftcluster.access.tunnel import serve_tunnel

    rec = RunStore().get(run)
    if rec.scheduler != "remote" or not rec.cluster_source:
        raise UserError(f"run {rec.run_id} was launched from this machine, not through a login node: its endpoint "
                        "is reached directly", field="RUN", hint="`ftcluster status RUN` shows it")
    cluster = load_cluster(rec.cluster_source)
    if remote_port is None and protocol == "grpc":
        remote_port = cluster.ports.grpc
    port = local_port or (remote_port if remote_port else cluster.ports.http)
    serve_tunnel(cluster, rec.run_id, port, protocol, remote_port, lambda text: click.echo(text, err=True),
                 check_every=check_every)
