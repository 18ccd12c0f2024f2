"""Stage progress: a rich bar with an ETA on a terminal, plain lines in CI logs and pipes."""

import io

from rich.console import Console

from ncnnport.stages import Progress


def _run(console):
    with Progress("toy", "convert", ["a", "b", "c"], {"a": 1 << 20, "b": 1 << 30}, console=console) as p:
        p.skip("a")
        p.finish(2, "b", 1.5, ", peak RSS 10 MB")
        p.finish(3, "c", 0.5)
    return p


def test_plain_lines_when_not_a_terminal(capsys):
    out = io.StringIO()
    _run(Console(file=out, force_terminal=False))
    err = capsys.readouterr().err.splitlines()
    assert out.getvalue() == ""  # no bar, no control codes
    assert err[0].startswith("[ncnnport] toy: convert [2/3] b 1.5 s, peak RSS 10 MB (elapsed 0:00:")
    assert "ETA" in err[0] and err[1].startswith("[ncnnport] toy: convert [3/3] c 0.5 s")


def test_a_bar_with_eta_on_a_terminal(capsys):
    out = io.StringIO()
    _run(Console(file=out, force_terminal=True, width=120))
    text = out.getvalue()
    assert "3/3" in text and "ETA 0:00:00" in text and "toy: convert [2/3] b 1.5 s" in text
    assert capsys.readouterr().err == ""  # the lines went through the bar's console


def test_eta_weighs_remaining_modules_by_bytes():
    p = Progress("toy", "export", ["small", "big"], {"small": 0, "big": 3 * Progress.OVERHEAD_BYTES})
    p.done_cost, p.remaining = p.cost["small"], p.cost["big"]
    p.t0 -= 10.0  # the small module took 10 s
    assert 39.0 < p.eta_seconds() < 41.0  # the big one costs 4x: ~40 s left
