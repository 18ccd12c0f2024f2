"""``parity --official-ref``: a port without an official runner says so in one skipped row, and
the CLI's table shows where tokens first differ; the rows are reported, never gated."""

from __future__ import annotations

from ncnnport.cli import build_parser, official_table
from ncnnport.registry import get_port


def test_a_port_without_an_official_runner_reports_one_skipped_ungated_row() -> None:
    rows = get_port("youtu-vl").official_reference(ctx=None)
    assert len(rows) == 1 and rows[0]["skipped"] and rows[0]["gated"] is False
    assert "youtu-vl" in rows[0]["reason"]


def test_official_table_names_the_first_differing_chunk_and_step() -> None:
    table = official_table([
        {"fixture": "a", "tokens_equal": True, "first_diff_chunk": None, "first_diff_step": None, "text_equal": True},
        {"fixture": "b", "tokens_equal": False, "first_diff_chunk": 0, "first_diff_step": 7, "text_equal": False},
        {"fixture": "*", "skipped": True, "reason": "venv not set"},
    ]).splitlines()
    assert table[2].startswith("| a | True | - | True")
    assert table[3].startswith("| b | False | 0 / 7 | False")
    assert "skipped: venv not set" in table[4]


def test_parity_takes_the_official_ref_flag() -> None:
    assert build_parser().parse_args(["parity", "qwen3-asr", "--official-ref"]).official_ref
    assert not build_parser().parse_args(["parity", "qwen3-asr"]).official_ref
