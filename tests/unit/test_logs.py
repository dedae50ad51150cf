"""Log tailing and following on real files (no cluster needed)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ftcluster.run.logs import Follower, LogSource, follow, tail_lines


def test_tail_of_a_1gb_file_reads_only_its_end(tmp_path: Path) -> None:
    big = tmp_path / "big.log"
    with open(big, "wb") as fh:
        # 1 GB: a sparse start (no disk, no time) and 200 real lines at the end.
        fh.truncate(1 << 30)
        fh.seek(0, os.SEEK_END)
        fh.write(b"".join(b"line %d\n" % i for i in range(200)))
    assert big.stat().st_size > 1 << 30
    got = tail_lines(str(big), 100)
    assert got == [f"line {i}" for i in range(100, 200)]


def test_tail_edge_cases(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    p.write_bytes(b"")
    assert tail_lines(str(p), 5) == []
    p.write_bytes(b"a\nb")          # no trailing newline
    assert tail_lines(str(p), 5) == ["a", "b"]
    p.write_bytes(b"a\nb\n")
    assert tail_lines(str(p), 1) == ["b"]
    assert tail_lines(str(p), 0) == []


def test_follow_picks_up_files_that_appear_later_and_partial_lines(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    srcs = [LogSource("rank0 n1", str(a)), LogSource("rank1 n2", str(b))]
    seen: list[tuple[str, str]] = []
    ended = threading.Event()

    def writer() -> None:
        a.write_text("first\n")
        time.sleep(0.1)
        with open(a, "a") as fh:
            fh.write("half")
            fh.flush()
            time.sleep(0.1)
            fh.write(" line\n")
        b.write_text("late file\nno newline at the end")
        time.sleep(0.1)
        ended.set()

    t = threading.Thread(target=writer)
    t.start()
    follow(Follower(srcs), ended.is_set, lambda s, line: seen.append((s.label, line)))
    t.join()
    assert seen == [("rank0 n1", "first"), ("rank0 n1", "half line"), ("rank1 n2", "late file"),
                    ("rank1 n2", "no newline at the end")]
