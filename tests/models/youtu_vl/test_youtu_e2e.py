"""The generic parity driver on the Youtu-VL tiny preset: every local and end-to-end gate."""

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def summary(built):
    from ncnnport.drivers.parity import run_parity

    prep, pkg = built
    return run_parity(prep, pkg)


def test_every_local_and_e2e_gate_passes(summary) -> None:
    failed = [r for r in summary["modules"] + summary["e2e"] if not r["passed"]]
    assert not failed, failed[:3]
    assert summary["gates_passed"] and summary["e2e"]
    kinds = {r["kind"] for r in summary["e2e"]}
    assert "tokens" in kinds, kinds
