"""The cells of a published-run file read as what they say, or refused with the cell's value (issue 67:
``cp_or_sp = 2`` was read as cp 1 and its row skipped; ``zero_stage = 12`` as ZeRO-1; ``tp = 1.5`` as 2).
A cell is never silently read as something else: a bare number in cp_or_sp is the cp degree, a
context-parallel mode named in it is the plan's cp_mode, and what is not understood skips the row
with the cell's value (:func:`paraplan.calibration.cells.cases_of_table`)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from paraplan.calibration.cells import cp_sp, int_cell, zero_stage
from paraplan.calibration import FILE_COLUMNS


@pytest.mark.parametrize("cell, want", [
    (None, (1, False, None)), (float("nan"), (1, False, None)), ("", (1, False, None)), ("none", (1, False, None)),
    ("1", (1, False, None)),
    ("2", (2, False, None)), (2.0, (2, False, None)), (4, (4, False, None)), ("2.0", (2, False, None)),
    ("sp", (1, True, None)), ("SP", (1, True, None)), ("sp (Megatron sequence parallel)", (1, True, None)),
    ("cp2", (2, False, None)), ("cp2; sp", (2, True, None)), ("sp; cp=4", (4, True, None)), ("CP 8", (8, False, None)),
    ("cp4 + sp", (4, True, None)),
    ("2 (ulysses)", (2, False, "ulysses")), ("cp2 (ulysses)", (2, False, "ulysses")),
    ("4 (ring attention)", (4, False, "ring")), ("ulysses 8", (8, False, "ulysses")),
    ("cp4 a2a", (4, False, "ulysses")), ("cp2 all-to-all", (2, False, "ulysses")),
    ("DeepSpeed-Ulysses sequence parallel 4", (4, False, "ulysses")),
    ("cp2 (guess); sp", (2, True, None)),
])
def test_cp_or_sp_cell(cell, want):
    assert cp_sp(cell) == want


@pytest.mark.parametrize("cell, needle", [
    ("0", "cp 0"), ("cp0", "cp 0"), ("2.5", "2.5"), ("cp2 cp4", "two degrees"), ("yes", "yes"),
    ("sp2", "sp has no degree"), ("sp=4", "sp has no degree"), ("cp-2", "-2"), ("lots", "lots"),
    ("ring", "ring without a degree"),
])
def test_cp_or_sp_cell_not_understood_names_the_cell(cell, needle):
    with pytest.raises(ValueError) as e:
        cp_sp(cell)
    assert "cp_or_sp" in str(e.value) and needle in str(e.value)


@pytest.mark.parametrize("cell, want", [
    (None, 7), (float("nan"), 7), ("", 7),
    ("3 (FSDP)", 3), ("3 (Megatron FSDP)", 3), ("1 (distributed optimizer - guess, recipe default)", 1),
    (3.0, 3), ("3.0", 3), ("0", 0), (2, 2), ("ZeRO-3", 3), ("zero3", 3), ("zero 2", 2), ("stage 2", 2),
    ("ZeRO stage 1", 1), ("zero-1 (guess)", 1), ("FSDP", 3), ("none", 0), ("no", 0), ("DDP", 0),
    ("distributed optimizer", 1),
])
def test_zero_stage_cell(cell, want):
    assert zero_stage(cell, default=7) == want


@pytest.mark.parametrize("cell", ["12", "4", "-1", "abc", "3.5", "zero-1 or 2", "1e3"])
def test_zero_stage_cell_not_understood_names_the_cell(cell):
    with pytest.raises(ValueError) as e:
        zero_stage(cell, default=0)
    assert "zero_stage" in str(e.value) and repr(cell) in str(e.value)


@pytest.mark.parametrize("cell, want", [("8", 8), (8.0, 8), ("1,024", 1024), ("8 (guess)", 8), (" 16 ", 16),
                                        ("4; per node", 4), (np_int := 3, np_int)])
def test_int_cell(cell, want):
    assert int_cell(cell) == want


@pytest.mark.parametrize("cell", ["1.5", 1.5, float("inf"), float("nan"), "inf", "1e400", "-2", "two", "", "0x10"])
def test_int_cell_refuses_what_is_not_a_whole_number(cell):
    """1.5 GPUs per tp group was rounded to 2, and inf raised OverflowError (a traceback in score)."""
    with pytest.raises(ValueError):
        int_cell(cell)


def _row(**cells):
    row = {c: None for c in FILE_COLUMNS}
    row.update(source="my cluster", measured_unit="tokens/s/GPU", notes="", model="Llama 3.1 8B", gpu="H100 SXM",
               seq_len=8192, num_gpus=16, tp=1, pp=1, dp=8, micro_batch=1, global_batch=128, precision="bf16",
               measured_metric="tokens_per_sec_per_gpu", measured_value=8000.0)
    row.update(cells)
    return row


def test_score_reads_a_bare_cp_degree(tmp_path, capsys):
    """The issue's row: cp_or_sp = 2 with tp 1 x pp 1 x dp 8 on 16 GPUs is cp 2 (it was read as cp 1,
    the product did not match the GPU count and the row was skipped); with a mode, that mode."""
    import json

    from paraplan.cli import main
    path = tmp_path / "runs.csv"
    pd.DataFrame([_row(cp_or_sp=2), _row(cp_or_sp="2 (ulysses)"), _row(cp_or_sp="cp2", zero_stage="12")],
                 columns=list(FILE_COLUMNS)).to_csv(path, index=False)
    assert main(["score", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["row"]: r for r in doc["rows"]}
    assert set(rows) == {0, 1}, doc["skipped"]
    assert "cp2" in rows[0]["case"] and "ulysses" in rows[1]["case"], (rows[0]["case"], rows[1]["case"])
    (skipped,) = doc["skipped"]
    assert skipped["row"] == 2 and "zero_stage cell 12" in skipped["reason"]
    assert all(math.isfinite(r["predicted_step_s"]) for r in rows.values())


def test_score_refuses_an_a100_precision_it_does_not_know_and_a_fractional_count(tmp_path, capsys):
    """An A100 row's 'fp32' precision was read as fp16 and its '1.5' micro-batch as 2, both scored; now
    each row is skipped with its cell's value (a blank precision stays the A100 files' fp16)."""
    import json

    from paraplan.cli import main
    gpt = dict(model="GPT 7.5B", layers=36, hidden=4096, heads=32, vocab=51200, seq_len=2048, gpu="A100 80GB",
               num_gpus=128, tp=4, pp=1, dp=32, micro_batch=16, global_batch=512, recompute="full",
               measured_metric="tflops_per_gpu_incl_recompute", measured_unit="TFLOP/s/GPU", measured_value=150.0)
    path = tmp_path / "runs.csv"
    pd.DataFrame([_row(**gpt, precision="fp16"), _row(**gpt, precision="fp32"), _row(**gpt, precision=None),
                  _row(**{**gpt, "micro_batch": "1.5"}, precision="fp16")],
                 columns=list(FILE_COLUMNS)).to_csv(path, index=False)
    assert main(["score", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["row"] for r in doc["rows"]} == {0, 2}
    reasons = {s["row"]: s["reason"] for s in doc["skipped"]}
    assert "precision 'fp32' not understood" in reasons[1] and "micro_batch cell 1.5 is not a whole number" in reasons[3], reasons


@pytest.mark.parametrize("cell", [2**31, 2**63, 2**70, str(2**63), "9" * 30])
def test_int_cell_refuses_a_count_past_a_c_int(cell):
    """A global_batch of 2**63 went on to the plan checks, where numpy raised OverflowError (a fuzzed
    `score` traceback)."""
    with pytest.raises(ValueError, match="past 2,147,483,647"):
        int_cell(cell, "global_batch")


@pytest.mark.parametrize("column", ["global_batch", "num_gpus"])
def test_score_skips_a_row_whose_count_overflows(tmp_path, capsys, column):
    """The fuzzed rows: global_batch or num_gpus = 2**63 tracebacked (OverflowError: Python int too large to
    convert to C long) in check_plan; now the row is skipped naming the cell, and a job or a cluster that
    large is refused wherever it is built (TrainingJob, Cluster)."""
    import json

    from paraplan.cli import main
    from paraplan.errors import ConfigError
    from paraplan.hardware.catalog import load_cluster
    from paraplan.hardware.model import Cluster
    from paraplan.workloads.transformer import TrainingJob
    path = tmp_path / "runs.csv"
    pd.DataFrame([_row(**{column: 2**63}, cp_or_sp=2), _row(cp_or_sp=2)], columns=list(FILE_COLUMNS)).to_csv(path, index=False)
    assert main(["score", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["row"] for r in doc["rows"]] == [1]
    (skipped,) = doc["skipped"]
    assert skipped["row"] == 0 and f"{column} cell" in skipped["reason"], skipped
    for key in ("seq_len", "global_batch"):
        with pytest.raises(ConfigError, match=key.replace("_", "-")):
            TrainingJob(**{"seq_len": 2048, "global_batch": 16, key: 2**63})
    system = load_cluster("dgx-h100", 8).system
    with pytest.raises(ConfigError, match="gpus.*at most 2,147,483,647"):
        Cluster("big", system, 2**63)


def test_batch_contradiction_names_the_three_figures():
    import pandas as pd

    from paraplan.calibration.cells import batch_contradiction
    row = pd.Series({"global_batch": 512, "micro_batch": 4, "dp": 16, "notes": "model TFLOP/s/GPU 153; GA 2; FSDP"})
    said = batch_contradiction(row)
    assert "global batch 512" in said and "4 x data-parallel 16 x gradient accumulation 2" in said
    assert "= 128" in said and "imply accumulation 8" in said
    assert batch_contradiction(pd.Series({**row.to_dict(), "notes": "GA 8"})) is None
    assert batch_contradiction(pd.Series({**row.to_dict(), "notes": "no accumulation stated"})) is None
    assert batch_contradiction(pd.Series({**row.to_dict(), "micro_batch": None})) is None
