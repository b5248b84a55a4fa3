"""`paraplan score RUNS.csv` as a new user writes the file (issue 65): a row whose model name has a
preset but whose columns give another shape is scored as the row's shape; ``amp_fp8`` and torchtitan's
"selective" recomputation are mapped, NVFP4 on a torchtitan row is refused with a reason that names it.
Each failed before issue 65 (the preset's 32 layers were used for a 16-layer row; amp_fp8 was "not
understood"; selective on torchtitan was refused as "layout not expressible")."""
import json

import pandas as pd
import pytest

from paraplan.calibration import FILE_COLUMNS, load_cases, load_h100_cases
from paraplan.cli import main


def _row(**cells):
    row = {c: None for c in FILE_COLUMNS}
    row.update(source="my torchtitan run", model="Llama 3 8B", seq_len=8192, gpu="H100-SXM", num_gpus=8, tp=1, pp=1,
               dp=8, micro_batch=1, global_batch=8, precision="bf16", recompute="full",
               measured_metric="tokens_per_sec_per_gpu", measured_value=7000.0, measured_unit="tokens/s/GPU", notes="")
    row.update(cells)
    return row


def _write(tmp_path, rows, name="runs.csv"):
    path = tmp_path / name
    pd.DataFrame(rows, columns=list(FILE_COLUMNS)).to_csv(path, index=False)
    return path


def test_a_row_with_a_preset_name_and_other_layers_is_scored_with_its_own_layers(tmp_path):
    cases, skipped = load_h100_cases(_write(tmp_path, [_row(layers=16, hidden=4096, heads=32, ffn_hidden=14336),
                                                       _row(layers=32, hidden=4096, heads=32, ffn_hidden=14336)]))
    assert not skipped
    short, full = cases
    assert short.model.layers == 16 and full.model.layers == 32
    assert short.model.kv_heads == full.model.kv_heads == 8          # what the columns cannot say stays the preset's
    assert any("layers 16 (preset 32)" in a for a in short.assumed)
    assert not any("preset 32" in a for a in full.assumed)


def test_a100_rows_with_a_partly_blank_shape_keep_the_columns_they_state(tmp_path):
    cases, _ = load_cases(_write(tmp_path, [_row(model="Llama 2 70B", layers=40, gpu="A100-SXM4-80GB", num_gpus=64,
                                                 tp=8, pp=1, dp=8, seq_len=4096, global_batch=64)]))
    assert cases[0].model.layers == 40 and cases[0].model.name == "llama2-70b"


def test_a_row_whose_heads_do_not_fit_the_presets_attention_names_the_columns(tmp_path):
    _, skipped = load_h100_cases(_write(tmp_path, [_row(heads=30)]))
    assert "heads 30" in skipped[0][2] and "8 key/value heads" in skipped[0][2]
    _, skipped = load_h100_cases(_write(tmp_path, [_row(moe_experts=8, moe_topk=2)]))
    assert "dense" in skipped[0][2] and "moe_experts 8" in skipped[0][2]


def test_amp_fp8_and_selective_on_torchtitan_are_mapped_and_nvfp4_is_named(tmp_path):
    cases, skipped = load_h100_cases(_write(tmp_path, [
        _row(precision="amp_fp8"), _row(recompute="selective"),
        _row(gpu="DGX-B200", precision="NVFP4")]))
    fp8, sac = cases
    assert fp8.plan.dtype == "fp8" and fp8.plan.engine == "torchtitan"
    assert sac.plan.recompute == "op-sac" and any("per-op selective" in a for a in sac.assumed)
    (_, _, reason), = skipped
    assert "NVFP4" in reason and "torchtitan" in reason and "NVFP4LinearConverter" in reason


def test_score_cli_scores_the_new_users_rows(tmp_path, capsys):
    path = _write(tmp_path, [_row(precision="amp_fp8"), _row(recompute="selective", layers=16),
                             _row(gpu="DGX-B200", precision="NVFP4")])
    assert main(["score", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["rows"]) == 2 and len(doc["skipped"]) == 1
    short = doc["rows"][1]
    assert short["predicted_step_s"] == pytest.approx(0.5 * doc["rows"][0]["predicted_step_s"], rel=0.5)
