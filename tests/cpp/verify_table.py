"""Reading the verify table that `ncnnport-cpp verify` and `ncnnport verify` print (shared by the
C++ verify and precision tests)."""

from __future__ import annotations


def rows(stdout: str) -> dict[str, tuple[str, str]]:
    """name -> (PASS|FAIL, detail) of a verify table's golden rows."""
    out = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] == "golden":
            out[cells[1]] = (cells[2], cells[3])
    return out
