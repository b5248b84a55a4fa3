"""`paraplan score RUNS.csv` names the runs it judges not to fit and the rows whose batch figures
contradict each other (issue 64): a user sees why, not only a False in the --rows table."""
import pandas as pd

from paraplan.calibration.h100 import H100_CSV
from paraplan.cli import main


def test_score_names_unfit_runs_and_contradicted_rows(tmp_path, capsys):
    table = pd.read_csv(H100_CSV)
    # GPT-OSS 120B on 64 H100 (GBS 512, MBS 4, GA 2 over dp 16) and Llama 3 70B Megatron-FSDP on 64 GB200 at
    # twice the micro-batch it ran (4: its recipe's activation offload no longer matches; it ran at 2 and fits)
    runs = tmp_path / "runs.csv"
    rows = table.iloc[[37, 21]].copy()
    rows.loc[rows.index[1], "micro_batch"] = 4
    rows.to_csv(runs, index=False)
    assert main(["score", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "rows whose figures contradict each other" in out
    contradiction = next(line for line in out.splitlines() if "contradict each other: global batch" in line)
    assert contradiction.startswith("  row 0 (Megatron-Bridge, GPT OSS 120B") and "= 128" in contradiction
    # the GPT-OSS row read at its recipe's micro-batch fits; the Megatron-FSDP row at micro-batch 4 is named with
    # the estimate's reason
    unfit = out.split("judged not to fit", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert len(unfit) == 1 and unfit[0].startswith("  row 1 (Megatron-Bridge, Llama 3 70B")
    assert "GPU memory: needs" in unfit[0]


def test_score_json_rows_carry_the_reason_a_run_does_not_fit(tmp_path, capsys):
    table = pd.read_csv(H100_CSV)
    runs = tmp_path / "runs.csv"
    table.iloc[[21, 31]].to_csv(runs, index=False)
    assert main(["score", str(runs), "--format", "json"]) == 0
    import json
    rows = json.loads(capsys.readouterr().out)["rows"]
    for r in rows:
        assert (r["not_fit_reason"] is None) == r["fits"]


def test_a_pipelined_row_without_vpp_is_read_as_1f1b_and_says_its_bubble(tmp_path, capsys):
    """A row that states pp but leaves vpp blank is priced as 1F1B; where the engine could have interleaved, the
    row's assumptions say so with the bubble that reading implies ((pp - 1)/m), and a stated vpp says nothing.
    Megatron-DeepSpeed (no interleaved schedule) says nothing either."""
    import json
    table = pd.read_csv(H100_CSV)
    row = table.iloc[[35]].copy()          # Llama 3 70B on 64 H100, Megatron-Bridge, tp4 pp8 vpp5
    assert int(row["pp"].iloc[0]) == 8 and not pd.isna(row["vpp"].iloc[0])
    blank_vpp = row.copy()
    blank_vpp["vpp"] = float("nan")
    runs = tmp_path / "runs.csv"
    pd.concat([row, blank_vpp]).to_csv(runs, index=False)
    assert main(["score", str(runs), "--format", "json"]) == 0
    stated, unstated = json.loads(capsys.readouterr().out)["rows"]
    m = int(row["global_batch"].iloc[0]) // (int(row["dp"].iloc[0]) * int(row["micro_batch"].iloc[0]))
    said = [a for a in unstated["assumptions"] if a.startswith("pipeline schedule 1F1B: vpp not stated")]
    assert len(said) == 1 and f"= 7/{m} = {round(700 / m)} %" in said[0]
    assert not any("vpp not stated" in a for a in stated["assumptions"])
    assert unstated["predicted_step_s"] > stated["predicted_step_s"]      # the 1F1B bubble is larger


def test_an_engine_without_interleaving_reads_a_blank_vpp_without_a_note():
    from paraplan.calibration import load_cases
    bloom = [c for c in load_cases()[0] if c.source.startswith("bigscience") and c.plan.pp > 1]
    assert bloom and all(c.plan.engine == "deepspeed" and c.plan.vpp == 1 for c in bloom)
    assert not any("vpp not stated" in a for c in bloom for a in c.assumed)
