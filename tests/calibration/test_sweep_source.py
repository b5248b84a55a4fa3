"""The Hagemann et al. 2023 sweep is not shipped (CC BY-NC-SA 4.0): the benchmarks read it from
--sweep-csv or PARAPLAN_SWEEP_CSV, say how to obtain it when it is absent, and
benchmarks/sweep_from_xlsx.py turns the published spreadsheets into the CSV they read."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

from paraplan.calibration import DEFAULT_CSV, H100_CSV
from paraplan.calibration.sweep import HOW_TO_OBTAIN, SWEEP_COLUMNS, SWEEP_ENV, sweep_available, sweep_csv

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _benchmark(name: str):
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sweep_is_named_by_argument_or_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(SWEEP_ENV, raising=False)
    assert sweep_csv() is None and sweep_available() is None
    assert sweep_csv(tmp_path / "given.csv") == tmp_path / "given.csv"
    monkeypatch.setenv(SWEEP_ENV, str(tmp_path / "missing.csv"))
    assert sweep_csv() == tmp_path / "missing.csv" and sweep_available() is None
    (tmp_path / "missing.csv").write_text("x\n")
    assert sweep_available() == tmp_path / "missing.csv"


def test_without_the_sweep_accuracy_says_how_to_obtain_it(monkeypatch):
    """From a clone (no sweep): the published files are scored, the sweep is left out, and the output
    names the repository, the commit, the converter and the variable."""
    monkeypatch.delenv(SWEEP_ENV, raising=False)
    accuracy = _benchmark("accuracy")
    lines: list[str] = []
    df, sweep, _, _, inputs = accuracy.scored_frames(DEFAULT_CSV, H100_CSV, sweep_csv(), report=lines.append)
    assert sweep is None and inputs == ["published_runs_calibration.csv", "published_runs_calibration_h100.csv"]
    assert len(df) == 139
    told = [line for line in lines if line.startswith("sweep not given")]
    assert told and HOW_TO_OBTAIN in told[0]
    for words in ("Aleph-Alpha/NeurIPS-WANT-submission-efficient-parallelization-layouts", "e13c2cb5",
                  "benchmarks/sweep_from_xlsx.py", SWEEP_ENV, "CC BY-NC-SA"):
        assert words in HOW_TO_OBTAIN


def _workbook(path: Path, rows: list[list], sequence_parallel: bool = False) -> None:
    """A workbook laid out as the sweep's: a title row, the header, one row per run."""
    openpyxl = pytest.importorskip("openpyxl", reason="openpyxl is not installed: the converter reads .xlsx with it")
    header = ["Trial ID", "World Size", "Average Step Time", "Average Step Time * World size",
              "Average TFlops Megatron", "Average TFlops Aleph Alpha", "Average MFU",
              "activation_checkpointing_type", "kernel", "micro_batch_size", "model_parallel_size",
              "pipe_parallel_size"] + (["sequence_parallel"] if sequence_parallel else [])
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append([path.stem])
    sheet.append(header)
    for row in rows:
        sheet.append(row)
    book.save(path)


def test_the_converter_writes_the_columns_the_benchmarks_read(tmp_path):
    pytest.importorskip("openpyxl", reason="openpyxl is not installed: the converter reads .xlsx with it")
    data = tmp_path / "data"
    (data / "seqpara").mkdir(parents=True)
    _workbook(data / "llama_13B_bfloat16_64_GPUs_all_runs.xlsx", [
        [101, 64, 26.5, 1696, 190.0, 209.2, 0.7057, "disabled", "flash_attention2 + RMS kernel", 1, 1, 1],
        [102, 64, None, None, None, None, "OOM Error", "disabled", "flash_attention2", 8, 2, 2],
        [103, 64, None, None, None, None, "Other Error", "every_layer", "torch", 2, 2, 1],
    ])
    _workbook(data / "seqpara" / "llama_30B_bfloat16_64_GPUs_sequence_parallelism.xlsx", [
        [201, 64, 80.0, 5120, 150.0, 160.0, 0.52, "every_layer", "fused", 1, 4, 2, True],
    ], sequence_parallel=True)
    _workbook(data / "llama_13B_bfloat16_8k_seq_length_128_GPUs_all_runs.xlsx", [
        [301, 128, 30.0, 3840, 170.0, 180.0, 0.6, "disabled", "flash_attention2", 1, 2, 1],
    ])
    converter = _benchmark("sweep_from_xlsx")
    out = tmp_path / "sweep.csv"
    assert converter.main([str(data), "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert tuple(table.columns) == SWEEP_COLUMNS
    assert sorted(table.trial) == [101, 102, 201]                  # "Other Error" and the 8k workbook left out
    first = table.set_index("trial").loc[101]
    assert (first.model, first.seq_len, first.gpus, first.global_batch_tokens) == ("llama1-13b", 2048, 64, 4194304)
    assert (first.tp, first.pp, first.micro_batch, first.sp, first.oom) == (1, 1, 1, 0, 0)
    assert first.measured_mfu == pytest.approx(0.7057) and first.measured_step_s == pytest.approx(26.5)
    oom = table.set_index("trial").loc[102]
    assert oom.oom == 1 and pd.isna(oom.measured_mfu) and pd.isna(oom.measured_step_s)
    sp = table.set_index("trial").loc[201]
    assert (sp.model, sp.sp, sp.checkpointing, sp.kernel) == ("llama1-30b", 1, "every_layer", "fused")
    # what accuracy.py makes of it: the runs that fit, estimated with the layout each ran
    accuracy = _benchmark("accuracy")
    frame = accuracy.sweep_frame(out)
    assert sorted(frame.case) == ["llama_13B_bfloat16_64_GPUs_all_runs trial 101",
                                  "llama_30B_bfloat16_64_GPUs_sequence_parallelism trial 201"]
    assert converter.main([str(data), "--out", str(out), "--all-lengths"]) == 0
    assert 301 in set(pd.read_csv(out).trial)


def test_the_converter_refuses_a_folder_without_workbooks(tmp_path, capsys):
    converter = _benchmark("sweep_from_xlsx")
    assert converter.main([str(tmp_path), "--out", str(tmp_path / "x.csv")]) == 2
    assert "no workbook" in capsys.readouterr().err
