"""The ranks' appended lines as the job follows them (state/exits, state/loads): read on a
descriptor held open, from where the file ended when the incarnation started, a line only once
it is whole."""

from __future__ import annotations

from pathlib import Path

from ftcluster.job.ranks import ExitWatch, LoadWatch


def test_loads_of_this_incarnation_only_and_whole_lines_only(tmp_path: Path) -> None:
    (tmp_path / "loads").write_text("1 100.0 0\n2 100.1 0\n")   # the incarnation before
    loads = LoadWatch(str(tmp_path), 3)
    assert loads.not_loaded() == [1, 2] and not loads.has(0)
    with open(tmp_path / "loads", "a") as f:
        f.write("0 200.0 1\n2 200.1")          # rank 2's line still being written
        f.flush()
        assert loads.has(0) and loads.not_loaded() == [1, 2]
        f.write(" 1\n1 200.2 1\n")
    assert loads.not_loaded() == [] and loads.has(2)
    loads.close()


def test_a_death_is_seen_once_and_a_stop_is_not_a_death(tmp_path: Path) -> None:
    (tmp_path / "exits").write_text("1 137 100.0 died 0\n")   # the incarnation before
    exits = ExitWatch(str(tmp_path))
    assert exits.died() is None
    with open(tmp_path / "exits", "a") as f:
        f.write("0 0 200.0 stopped 1\n2 1 200.1 died 1\n")
    assert exits.died() == (2, "1")
    assert exits.died() is None
    exits.close()


def test_every_rank_exited_and_a_death_is_remembered(tmp_path: Path) -> None:
    (tmp_path / "exits").write_text("0 0 100.0 stopped 0\n1 137 100.1 died 0\n2 143 100.2 stopped 0\n")
    exits = ExitWatch(str(tmp_path))
    assert not exits.any_died() and not exits.all_exited(3)   # the incarnation before is not this one's
    with open(tmp_path / "exits", "a") as f:
        f.write("2 137 200.0 died 1\n0 143 200.1 stopped 1\n")
    assert exits.died() == (2, "137")
    assert exits.any_died() and not exits.all_exited(3)        # still known after died() took it
    with open(tmp_path / "exits", "a") as f:
        f.write("1 143 200.2 stopped 1\n")
    assert exits.all_exited(3) and exits.dead == {2}
    exits.close()


def test_a_rank_exit_record_not_yet_whole_names_no_rank(tmp_path: Path) -> None:
    # rank_server.sh's `>` empties rank<R>.exit before its one write: read in between (or left so
    # by a wrapper killed there), the rank recorded no exit -- it is not the first to die, code "?".
    from ftcluster.job.ranks import RankFiles, parse_exit
    from ftcluster.observe.status import rank_exit

    assert parse_exit("") is None and parse_exit("137") is None and parse_exit("137 17") is None
    assert parse_exit("137 1700000000.5 died\n") == ("137", 1700000000.5, "died")
    assert parse_exit("x 1.0 died") is None and parse_exit("1 y died") is None and parse_exit("1 1.0 gone") is None
    state = tmp_path / "state"
    state.mkdir()
    ranks = RankFiles(str(state), str(tmp_path), 2)
    (state / "rank0.exit").write_text("")
    (state / "rank1.exit").write_text("143 200.0 stopped\n")
    assert ranks.first_died() is None and ranks.exit(0) is None and rank_exit(state, 0) is None
    (state / "rank0.exit").write_text("137 201.0 died\n")
    assert ranks.first_died() == 0 and rank_exit(state, 0) == ("137", "died")
