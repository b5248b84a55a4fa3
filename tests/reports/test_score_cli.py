"""`paraplan score RUNS.csv`: measured runs of any generation, each read by its generation's loader,
against the estimates; the same figures as benchmarks/accuracy.py on the calibration files."""
import json

import pandas as pd
import pytest

from paraplan.cli import main
from paraplan.calibration import FILE_COLUMNS, H100_CSV, load_h100_cases, score
from paraplan.costmodels.estimate import estimate


def _row(**cells):
    row = {c: None for c in FILE_COLUMNS}
    row.update(source="my cluster", measured_unit="tokens/s/GPU", notes="")
    row.update(cells)
    return row


def test_score_of_the_h100_file_matches_the_calibration_loader(capsys):
    assert main(["score", str(H100_CSV), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cases, _ = load_h100_cases()
    ref = score(cases, estimate)
    assert doc["schema"] == "paraplan.score/1" and len(doc["rows"]) == len(ref) == 63 and not doc["skipped"]
    mape = 100 * (ref.measured_s / ref.predicted_s - 1).abs().mean()
    assert doc["by_source"]["OVERALL"]["mape_%"] == pytest.approx(mape)
    assert set(doc["by_generation"]) == {"H100-class", "Blackwell", "OVERALL"}
    assert all(r["assumptions"] for r in doc["rows"])


def test_a_mixed_file_is_read_row_by_row_and_says_what_it_skips(tmp_path, capsys):
    """An A100 row (GPT columns, A100 defaults) and an H100 row (preset by name) in one file, a row on a
    GPU without a preset and one with an unreadable cell: two scored, two skipped with their reasons;
    --out writes the same report whole."""
    path = tmp_path / "runs.csv"
    pd.DataFrame([
        _row(model="GPT 7.5B", layers=36, hidden=4096, heads=32, vocab=51200, seq_len=2048, gpu="A100 80GB",
             num_gpus=128, tp=4, pp=1, dp=32, micro_batch=16, global_batch=512, precision="fp16", recompute="full",
             measured_metric="tflops_per_gpu_incl_recompute", measured_unit="TFLOP/s/GPU", measured_value=150.0),
        _row(model="Llama 3.1 8B", gpu="H100 SXM", seq_len=8192, num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1,
             global_batch=128, precision="bf16", measured_metric="tokens_per_sec_per_gpu", measured_value=8000.0),
        _row(model="Llama 3.1 8B", gpu="TPU v5p", seq_len=8192, num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1,
             global_batch=128, precision="bf16", measured_metric="tokens_per_sec_per_gpu", measured_value=8000.0),
        _row(model="Llama 3.1 8B", gpu="H100", seq_len=8192, num_gpus=8, tp="two", pp=1, dp=8, micro_batch=1,
             global_batch=128, precision="bf16", measured_metric="tokens_per_sec_per_gpu", measured_value=8000.0),
    ], columns=list(FILE_COLUMNS)).to_csv(path, index=False)
    assert main(["score", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_row = {r["row"]: r for r in doc["rows"]}
    assert set(by_row) == {0, 1}
    assert by_row[0]["generation"] == "A100" and by_row[1]["generation"] == "H100-class"
    assert any("ZeRO-1" in a for a in by_row[1]["assumptions"])          # the H100 loader's default, said
    reasons = {s["row"]: s["reason"] for s in doc["skipped"]}
    assert "TPU v5p" in reasons[2] and "'two'" in reasons[3]
    for r in doc["rows"]:
        assert r["throughput_error_%"] == pytest.approx(100 * (r["measured_step_s"] / r["predicted_step_s"] - 1))
        assert r["interval_low_s"] < r["predicted_step_s"] < r["interval_high_s"]
    out = tmp_path / "report.txt"
    assert main(["score", str(path), "--rows", "--out", str(out)]) == 0
    text = out.read_text()
    assert "2 rows scored, 2 skipped" in text and "by hardware generation" in text and "TPU v5p" in text


def test_score_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    for target in (str(bad), str(tmp_path / "missing.csv")):
        assert main(["score", target]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert main(["score", str(tmp_path / "missing.csv")]) == 2 and "no such file" in capsys.readouterr().err


def test_corrupted_cells_never_crash_the_reader(tmp_path):
    """Every row of the H100 file with one cell replaced by junk (seeded): each row is scored or
    skipped with a reason; nothing raises."""
    import random
    from paraplan.reports.score import score_runs
    rng = random.Random(40)
    table = pd.read_csv(H100_CSV)
    junk = ["", "n/a", "-1", "0", "1e9", "8 (guess)", "eight", "cp", "sp; cp0", "FP4", "nan", "3.5", "none", "yes",
            "DGX-Z9", "Llama 9 9B", "?"]
    rows = []
    for _ in range(3):
        for _, r in table.iterrows():
            r = r.copy().astype(object)
            r[rng.choice([c for c in table.columns if c != "source"])] = rng.choice(junk)
            rows.append(r)
    path = tmp_path / "junk.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    scored = score_runs(path)
    assert len(scored.rows) + len(scored.skipped) == len(rows)
    assert all(reason for _, _, reason in scored.skipped)
    assert scored.rows["predicted_step_s"].gt(0).all() and scored.rows["measured_step_s"].gt(0).all()
