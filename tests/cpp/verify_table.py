"""Reading what `ncnnport-cpp verify` and the executables print: the verify table's rows and a
refusal's one line (shared by the C++ verify and precision tests)."""

from __future__ import annotations

import subprocess


def rows(stdout: str) -> dict[str, tuple[str, str]]:
    """name -> (PASS|FAIL, detail) of a verify table's golden rows."""
    out = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] == "golden":
            out[cells[1]] = (cells[2], cells[3])
    return out


def one_line_exit_2(res: subprocess.CompletedProcess, *needles: str) -> str:
    """A refusal: exit 2 and one stderr line holding every needle; returns that line."""
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
