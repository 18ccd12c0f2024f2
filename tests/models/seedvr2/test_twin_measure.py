"""twin_measure: the order of the interleaved rounds, the agreement line, and user input
checked before any model loads."""

from __future__ import annotations

import numpy as np
import pytest

from ncnnport.models.seedvr2.twin_measure import agreement, main, rotated_rounds


def test_rounds_change_the_order_and_time_every_call_once_per_round() -> None:
    seen: list[str] = []
    calls = {k: (lambda k=k: seen.append(k)) for k in ("a", "b", "c")}
    times = rotated_rounds(calls, 4)
    assert seen == list("abc" "cba" "bca" "acb")  # perf_timing.round_order
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(t >= 0 for v in times.values() for t in v)


def test_agreement_reports_max_abs_and_cosine() -> None:
    ref = np.array([[1.0, -2.0], [3.0, 0.5]], dtype=np.float32)
    assert "max_abs 0.000e+00" in agreement(ref, ref) and "cosine 1.00000000" in agreement(ref, ref)
    line = agreement(ref, -ref)
    assert "max_abs 6.000e+00 (max|ref| 3.000)" in line and "cosine -1.00000000" in line


@pytest.mark.parametrize("args,why", [(["--size", "250x256"], "multiples of 16"), (["--size", "big"], "use HxW"),
                                      (["--rounds", "0"], ">= 1")])
def test_bad_arguments_fail_before_any_model_loads(args, why, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2 and why in capsys.readouterr().err


def test_a_missing_package_names_the_convert_command(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--build-dir", str(tmp_path), "--layers", "2"])
    assert "ncnnport convert seedvr2 --preset real --layers 2" in capsys.readouterr().err
