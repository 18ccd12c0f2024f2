"""Speed targets judged on the rows of one ``bench --perf`` run: each printed with the measured
value and ``met`` / ``not met``, never a stored verdict.

A model's bench module declares its targets (``PERF_TARGETS``) as data: which stage and size,
which row field, the threshold. The generic judge here knows no model. A target the speed table
cannot measure (e.g. peak RSS, which needs a process per runtime) is printed as not measured
with its reason, so the list of targets stays complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ncnnport.runtime.perf_timing import order_text

HEADER = "| target | threads | measured | needed | verdict |"


@dataclass(frozen=True)
class PerfTarget:
    """One target. ``metric`` is a row field (``ncnn_pct_of_bound``, ``ratio`` = torch/ncnn,
    ``ncnn_ms`` ...); with ``over_size`` the value is the median of per-round ratios of this
    row's metric over the same metric at ``over_size`` (flatness; the row's ``over_size`` entry). ``weight_bytes`` limits the target to runs whose precision reads
    InnerProduct weights at that width (the fp32 vs fp16-weight targets). Where torch runs at
    ``saturation_pct`` or more of the bound, ``saturated_at_least`` replaces ``at_least``: a
    runtime cannot be far ahead of one that already saturates memory."""

    label: str
    stage: str
    size: str
    metric: str
    at_least: float | None = None
    at_most: float | None = None
    over_size: str | None = None
    weight_bytes: int | None = None
    saturated_at_least: float | None = None
    saturation_pct: float = 50.0
    unmeasured: str = ""

    def applies(self, weight_bytes: int) -> bool:
        return self.weight_bytes is None or self.weight_bytes == weight_bytes

    def needed(self, row: dict[str, Any]) -> tuple[str, float]:
        """The comparison and threshold for ``row`` (the saturated threshold where it applies)."""
        if self.at_most is not None:
            return "<=", self.at_most
        torch_pct = row.get("torch_pct_of_bound")
        if self.saturated_at_least is not None and torch_pct is not None and torch_pct >= self.saturation_pct:
            return ">=", self.saturated_at_least
        if self.at_least is None:
            raise ValueError(f"target {self.label!r}: give at_least or at_most")
        return ">=", self.at_least


def _find(rows: Sequence[dict[str, Any]], stage: str, size: str, threads: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["stage"] == stage and r["size"] == size and r["threads"] == threads), None)


def order_note(first: int | None, rounds: int, what: str) -> str:
    """The verdict note's words on how often ``what`` ran first (``perf_timing.order_text``)."""
    return "" if first is None else "; " + order_text(what, first, rounds)


def judge_one(target: PerfTarget, rows: Sequence[dict[str, Any]], threads: int) -> dict[str, Any]:
    """The verdict of ``target`` on the rows of one thread count."""
    out: dict[str, Any] = {"target": target.label, "threads": threads, "value": None, "needed": None,
                           "met": None, "note": ""}
    if target.unmeasured:
        return {**out, "note": f"not measured: {target.unmeasured}"}
    row = _find(rows, target.stage, target.size, threads)
    if row is None or row.get(target.metric) is None:
        return {**out, "note": f"not measured: no {target.metric} for {target.stage}@{target.size} in this run"}
    value = float(row[target.metric])
    if target.over_size is not None:
        base = _find(rows, target.stage, target.over_size, threads)
        if base is None or not base.get(target.metric):
            return {**out, "note": f"not measured: no {target.stage}@{target.over_size} in this run"}
        # the sizes share their rounds (torch_ratio.time_sizes): the median of per-round ratios,
        # which a load arriving between the sizes does not move; never the ratio of two medians
        per_round = row.get("over_size", {}).get(target.over_size, {}).get(target.metric)
        if per_round is None:
            return {**out, "note": f"not measured: no per-round {target.metric} ratio of {target.stage}@{target.size} "
                                   f"over @{target.over_size} (the sizes were not timed in one loop)"}
        value = float(per_round["median"])
        out["note"] = (f"median of {per_round['rounds']} per-round ratios "
                       f"[{per_round['ci_low']:.2f}, {per_round['ci_high']:.2f}]"
                       + order_note(per_round.get("first"), per_round["rounds"], f"@{target.size}"))
    op, limit = target.needed(row)
    met = value >= limit if op == ">=" else value <= limit
    return {**out, "value": value, "needed": f"{op} {limit:g}", "met": met}


def judge(targets: Sequence[PerfTarget], rows: Sequence[dict[str, Any]], weight_bytes: int) -> list[dict[str, Any]]:
    """Every applicable target at every thread count of ``rows`` (once when there are none)."""
    counts = sorted({r["threads"] for r in rows}) or [0]
    return [judge_one(t, rows, n) for t in targets if t.applies(weight_bytes) for n in counts]


# Which loop these verdicts judge. Why said: the ncnn column times the package's graphs through the
# Python ncnn wheel (ncnn's own layers), while the shipped C++ executables run ncnnport's one-row
# kernels in their place; a "not met" here is the wheel's, and the same decode targets on the
# shipped loop are `make bench-cpp`'s (Qwen3-ASR real-L4 fp16 token, 2-core Xeon VM, 2026-12-04:
# 79 / 68 % of the bound at P=100 / 1000 through the wheel, 86-90 / 82-89 % on the C++ loop).
LOOP_NOTE = ("judged on this table's ncnn column: the package's graphs through the Python ncnn wheel; "
             "the shipped C++ loop is judged on its own by `make bench-cpp`")


def format_verdict(v: dict[str, Any]) -> str:
    if v["met"] is None:
        return f"| {v['target']} | {v['threads']} | - | - | {v['note']} |"
    measured = f"{v['value']:.3g}" + (f" ({v['note']})" if v.get("note") else "")
    return (f"| {v['target']} | {v['threads']} | {measured} | {v['needed']} | "
            f"{'met' if v['met'] else 'not met'} |")


def print_verdicts(model: str, verdicts: Sequence[dict[str, Any]]) -> None:
    if not verdicts:
        return
    print(f"\ntargets ({model}):")
    print(HEADER)
    print("|---|---|---|---|---|")
    for v in verdicts:
        print(format_verdict(v))
    print(LOOP_NOTE)
