"""A published TFLOP/s or MFU is turned into a step time with its source's own count of causal attention
(paraplan/data/flop_conventions.yaml): Megatron-Bridge halves it, torchtitan and NeMo count it whole. Read
the other way, a long-sequence run looks far slower than it ran (issue 64, regime 1)."""
import pandas as pd
import pytest

from paraplan.calibration.cells import flop_convention_rules, measured_step_time_s, source_counts_causal_half
from paraplan.workloads.presets import load_model


@pytest.mark.parametrize("source, notes, halved", [
    ("Megatron-Bridge docs/performance-summary.md", "", True),
    ("maxtext benchmarks", "", True),
    ("torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md", "", False),
    ("NeMo docs/source/performance/performance_summary.md", "", False),
    ("a paper nobody has a rule for", "", False),
    ("a paper nobody has a rule for", "MFU; FLOPs count causal attention halved", True),
    ("Megatron-Bridge docs/performance-summary.md", "FLOPs count causal attention whole", False),
])
def test_source_counts_causal_half(source, notes, halved):
    assert source_counts_causal_half(source, notes) is halved


def test_every_rule_names_its_source():
    assert flop_convention_rules()[-1] == ((), False)        # the default: counted whole
    assert len(flop_convention_rules()) >= 4


@pytest.mark.parametrize("seq, low, high", [(8192, 1.10, 1.15), (32768, 1.33, 1.40), (131072, 1.65, 1.75)])
def test_halved_count_shortens_the_measured_step_by_the_attention_share(seq, low, high):
    """The same published TFLOP/s, counted by a source that halves causal attention, is a shorter step:
    by F_whole / F_halved, which grows with the sequence (Llama 3 8B: 1.13x at 8k, 1.36x at 32k, 1.70x at 128k)."""
    model = load_model("llama3-8b")
    whole = measured_step_time_s("tflops_per_gpu", 400.0, "TFLOP/s/GPU", 8, seq, 64, model)
    halved = measured_step_time_s("tflops_per_gpu", 400.0, "TFLOP/s/GPU", 8, seq, 64, model, causal_halved=True)
    assert low < whole / halved < high
    mfu_whole = measured_step_time_s("mfu", 40.0, "%", 8, seq, 64, model, 989e12)
    mfu_halved = measured_step_time_s("mfu", 40.0, "%", 8, seq, 64, model, 989e12, causal_halved=True)
    assert mfu_whole / mfu_halved == pytest.approx(whole / halved)
    # tokens/s carries no convention
    assert measured_step_time_s("tokens_per_sec_per_gpu", 1000.0, "", 8, seq, 64, model) == pytest.approx(8 * seq / 64e3)


def test_a_megatron_bridge_tflops_row_is_read_with_the_halved_count():
    """A row of the H100 file's shape: the case's measured step follows Megatron-Bridge's count."""
    from paraplan.calibration.h100 import case_from_h100_row
    row = {"source": "Megatron-Bridge docs/performance-summary.md", "model": "Llama 3 8B", "params_b": 8,
           "layers": "", "hidden": "", "heads": "", "ffn_hidden": "", "vocab": "", "seq_len": 65536,
           "moe_experts": "", "moe_topk": "", "gpu": "H100", "num_gpus": 16, "tp": 1, "pp": 1, "dp": 2,
           "cp_or_sp": "cp8", "ep": 1, "vpp": "", "zero_stage": "", "offload": "", "recompute": "full",
           "micro_batch": 1, "global_batch": 16, "precision": "bf16", "measured_metric": "tflops_per_gpu",
           "measured_value": 400.0, "measured_unit": "TFLOP/s/GPU", "notes": ""}
    r = pd.Series(row).replace("", float("nan"))
    case = case_from_h100_row(0, r)
    assert not isinstance(case, str), case
    model = case.model
    expected = 16 * 65536 * model.model_flops_per_token(65536, True) / (400e12 * 16)
    assert case.measured_step_time_s == pytest.approx(expected)
    titan = case_from_h100_row(0, r.replace("Megatron-Bridge docs/performance-summary.md", "torchtitan x"))
    assert titan.measured_step_time_s > 1.4 * case.measured_step_time_s
