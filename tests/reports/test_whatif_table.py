"""The what-if table shows every plan choice that differs between the points (issue 67: it showed only
the degrees, ``tp2 pp1 dp4 mb1 sp``, hiding that the best plans differ in ZeRO stage, offload and
schedule), and the choices they share on one line."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from paraplan.cli import main  # noqa: E402
from paraplan.reports.points_text import differing_choices, shared_choices, shown_plan  # noqa: E402


def _table(capsys, tmp_path, *sweep):
    """The ZeRO paper's accounting (``--engine generic``): the engine whose best plans differ in the most
    choices over these sweeps (under Megatron-LM they share schedule and offload)."""
    out = tmp_path / "report"
    assert main(["whatif", "--model", "llama3-70b", "--cluster", "dgx-h100", "--seq-len", "4096",
                 "--global-batch", "128", "--engine", "generic", "--no-heatmap", "--quiet", "--out", str(out), *sweep]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["label", "gpus"])
    body = [ln for ln in lines[header + 1:] if not ln.startswith(("every point", "figures", "skipped", "wrote"))]
    shared = next((ln for ln in lines if ln.startswith("every point")), "")
    return lines[header].split(), [ln.split() for ln in body], shared, pd.read_csv(out / "points.csv")


def test_whatif_table_shows_the_choices_that_differ(capsys, tmp_path):
    """Llama 3 70B over 8..64 H100: the best plans differ in schedule, ZeRO, offload and cp mode; each is
    a column, with the point's own value (checked against points.csv), and what they share is said."""
    head, rows, shared, csv = _table(capsys, tmp_path, "--sweep", "gpus=8..64")
    for col in ("schedule", "zero", "offload"):
        assert col in head, head
    assert len(rows) == len(csv) == 4
    choices = head[3:-5]          # label, gpus, plan (several words), the choices, then 5 figures
    for cells, (_, point) in zip(rows, csv.iterrows()):
        assert int(cells[1]) == point["gpus"]
        got = dict(zip(choices, cells[-5 - len(choices):-5]))
        assert got["zero"] == str(point["zero"]) and got["offload"] == point["offload"]
        assert got["schedule"] == (point["schedule"] if point["pp"] > 1 else "-")
    # a choice is a column or said once as shared, never both (recompute: shared until the engine switches were
    # searched and the full memory share planned, since then one point recomputes)
    assert shared.startswith("every point: ") and "zero" not in shared
    assert ("recompute" in head) != ("recompute" in shared)


def test_whatif_table_sizes_its_numbers_to_the_resolution(capsys, tmp_path):
    head, rows, _, csv = _table(capsys, tmp_path, "--gpus", "16", "--sweep", "hbm=40,141")
    step = [r[head.index("step_s") - len(head)] for r in rows]
    assert all(len(s.replace(".", "").lstrip("0")) <= 3 for s in step), step     # 3 significant digits
    assert head.count("zero") == 1 and "offload" in head


def test_differing_and_shared_choices():
    a = shown_plan({"tp": 2, "pp": 1, "dp": 4, "cp": 1, "ep": 1, "etp": 1, "schedule": "1f1b", "zero": 1,
                    "cp_mode": "ring", "recompute": "none", "offload": "none", "engine": "megatron", "sp": True})
    b = {**a, "zero": "3", "offload": "cpu"}
    assert a["schedule"] == "-" and a["cp_mode"] == "-" and a["sp"] == "y"
    assert differing_choices([a, b]) == ["zero", "offload"]
    assert shared_choices([a, b], ["zero", "offload"]) == ["engine megatron", "recompute none"]


@pytest.mark.parametrize("x, want", [(6734.2, "6,730"), (0.21874, "0.219"), (77.93, "77.9"), (7.481, "7.48"),
                                     (float("nan"), "-")])
def test_three_significant_digits(x, want):
    from paraplan.reports.points_text import _fmt
    assert _fmt(x, 3) == want
