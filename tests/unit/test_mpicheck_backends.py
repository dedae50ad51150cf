"""The MPI check's backend libraries: each backend the run's models name is found where Triton
looks for it, hashed, and a rank whose library differs from rank 0's is named (any engine's
backend, not only FasterTransformer's)."""

from __future__ import annotations

from pathlib import Path

from ftcluster.rank.mpicheck import check_reports, local_report


def _install(root: Path, name: str, content: bytes) -> Path:
    (root / "bin").mkdir(parents=True, exist_ok=True)
    server = root / "bin" / "tritonserver"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    lib = root / "backends" / name / f"libtriton_{name}.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(content)
    return server


def test_a_backend_library_that_differs_between_ranks_is_named(tmp_path: Path) -> None:
    a = _install(tmp_path / "a", "echo", b"one build")
    b = _install(tmp_path / "b", "echo", b"another build")
    r0 = local_report(0, 2, "Open MPI v4.1", str(a), backends=["echo"])
    r1 = local_report(1, 2, "Open MPI v4.1", str(b), backends=["echo"])
    assert r0.backend_libraries["echo"][0] == str(tmp_path / "a" / "backends" / "echo" / "libtriton_echo.so")
    assert r0.missing_backends == [] and r1.missing_backends == []
    r1.host = "node1"
    problems = check_reports([r0, r1], 2, None, None)
    assert any("backend 'echo' library" in p and "differs from rank 0's" in p for p in problems), problems
    # The same build everywhere (the tritonserver wrapper differs by path, not content): no problem.
    c = _install(tmp_path / "c", "echo", b"one build")
    r2 = local_report(1, 2, "Open MPI v4.1", str(c), backends=["echo"])
    r2.host = "node1"
    assert not [p for p in check_reports([r0, r2], 2, None, None) if "library" in p]
