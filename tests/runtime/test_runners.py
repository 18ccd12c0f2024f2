"""The one runner lifecycle (runtime/lazy_modules.Runners): open on first use, hold until
released, at most ``resident`` open at once, every open and release logged."""

from __future__ import annotations

import pytest

from ncnnport.runtime.lazy_modules import LazyModules, LazyTorchModules, Runners


class Opened:
    def __init__(self, name: str) -> None:
        self.name = name


def _runners(resident: int | None = None) -> Runners:
    return Runners({n: None for n in ("a", "b", "c")}, Opened, resident)


def test_open_get_and_lookup_are_one_lifecycle() -> None:
    r = _runners()
    assert len(r) == 3 and "a" in r and "z" not in r and r.live == [] and r.opens == 0
    a = r.open("a")
    assert r.get("a") is a and r["a"] is a and r.opens == 1
    r.release("a")
    assert r.live == [] and r.open("a") is not a and r.opens == 2
    assert r.events == [("open", "a"), ("release", "a"), ("open", "a")]
    with pytest.raises(KeyError):
        r.open("z")


def test_resident_limit_releases_the_longest_open_runner() -> None:
    """``resident=1`` is the streamed parity's walk: opening the next graph drops the previous."""
    r = _runners(resident=1)
    for n in ("a", "b", "b", "c"):
        r[n]
    assert r.live == ["c"] and r.peak_live == 1 and r.opens == 3
    assert r.events == [("open", "a"), ("release", "a"), ("open", "b"), ("release", "b"), ("open", "c")]
    two = _runners(resident=2)
    two["a"], two["b"], two["c"]
    assert two.live == ["b", "c"] and two.peak_live == 2
    with pytest.raises(ValueError, match="resident must be >= 1"):
        _runners(resident=0)


def test_release_all_by_predicate_and_counts_per_kind() -> None:
    r = _runners()
    r["a"], r["b"], r["c"]
    r.release_all(lambda n: n != "b")
    assert r.live == ["b"] and r.opened(lambda n: n in "ac") == 2 and r.live_peak(lambda n: True) == 3
    r.release_all()
    assert r.live == []


def test_over_an_open_mapping_hands_out_its_runners() -> None:
    eager = {"x": object(), "y": object()}
    r = Runners.over(eager, resident=1)
    assert r.get("x") is eager["x"] and r["y"] is eager["y"] and r.live == ["y"]


def test_ncnn_and_torch_sides_are_the_same_lifecycle() -> None:
    assert issubclass(LazyModules, Runners) and issubclass(LazyTorchModules, Runners)
