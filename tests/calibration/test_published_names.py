"""Published runs named the many ways papers name them: GPU and model names read into presets, rows that
leave the architecture blank, other throughput metrics, and the reasons rows are skipped."""
import pandas as pd
import pytest

from paraplan.calibration import FILE_COLUMNS, load_cases, load_h100_cases
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.names import system_for_gpu
from paraplan.workloads.names import model_preset_for_name


@pytest.mark.parametrize("name, system", [
    ("A100-SXM4-80GB", "dgx-a100-80g"), ("A100 40GB", "dgx-a100-40g"), ("NVIDIA H100 80GB HBM3", "dgx-h100"),
    ("H100 SXM5", "dgx-h100"), ("H100-96GB HBM2e (Grand Teton, 500W)", "grand-teton-h100"),
    ("H200 SXM 141GB", "dgx-h200"), ("DGX-H200", "dgx-h200"), ("HGX B200", "dgx-b200"), ("GB200 NVL72", "gb200-nvl72"),
    ("DGX-GB300", "gb300-nvl72"), ("V100-SXM2-16GB", "dgx1-v100"), ("V100 32GB", "dgx2-v100"), ("H800", "hgx-h800"),
    ("MI300X", "mi300x-x8"), ("B300", "dgx-b300"), ("HGX B300", "dgx-b300"), ("B300-SXM-270GB", "dgx-b300"),
    ("DGX-B300", "dgx-b300"), ("GB300 NVL72", "gb300-nvl72"), ("AMD Instinct MI355X", "mi355x-x8"),
    ("MI325X 256GB HBM3E", "mi325x-x8"), ("MI350X-OAM-288GB", "mi350x-x8")])
def test_gpu_names_read_into_system_presets(name, system):
    found = system_for_gpu(name)
    assert not isinstance(found, str) and found.preset == system and found.assumption is None


def test_gpu_names_without_a_preset_say_why_and_unstated_memory_is_said():
    for name, words in (("H100 PCIe", "PCIe"), ("A100-PCIe-40GB", "PCIe"), ("TPU v4", "no system preset"),
                        ("MI250X", "MI355X are"), ("GH200", "GH200"),
                        ("dgx-h1000", "no system preset"), ("xb200", "no system preset")):
        reason = system_for_gpu(name)
        assert isinstance(reason, str) and words in reason and repr(name) in reason
    plain = system_for_gpu("A100")
    assert plain.preset == "dgx-a100-80g" and "memory not stated" in plain.assumption


@pytest.mark.parametrize("name, preset", [
    ("Llama 3.1 405B", "llama3-405b"), ("Llama-3.3-70B-Instruct", "llama3-70b"), ("meta-llama/Llama-3.1-8B", "llama3-8b"),
    ("LLaMA-65B", "llama1-65b"), ("llama-2-70b", "llama2-70b"), ("GPT-3 175B", "gpt3-175b"), ("Mixtral-8x22B", "mixtral-8x22b"),
    ("DeepSeek-V3", "deepseek-v3"), ("DeepSeekV3 (w/ MTP)", "deepseek-v3-mtp"), ("DeepSeek-V3 (w/o MTP)", "deepseek-v3"),
    ("Qwen3 235B A22B", "qwen3-235b-a22b"), ("GPT OSS 20B", "gpt-oss-20b"), ("Nemotron-4 340B", "nemotron4-340b"),
    ("BLOOM-176B", "bloom-176b"), ("Kimi-K2-Instruct", "kimi-k2"), ("meta-llama/Llama-4-Scout-17B-16E", "llama4-scout"),
    ("Llama 4 Maverick", "llama4-maverick")])
def test_model_names_read_into_presets(name, preset):
    assert model_preset_for_name(name) == preset


def test_model_names_without_a_preset_give_none():
    """A size with no preset is not rounded to a neighbour: Llama 3 13B and Falcon are not catalogued."""
    for name in ("Llama 3 13B", "Falcon-180B", "", "GPT-3 176B", "gpt-17b"):
        assert model_preset_for_name(name) is None


def _row(**cells):
    row = {c: None for c in FILE_COLUMNS}
    row.update(source="unseen paper", measured_unit="tokens/s/GPU", notes="")
    row.update(cells)
    return row


def _write(tmp_path, rows):
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows, columns=list(FILE_COLUMNS)).to_csv(path, index=False)
    return path


def test_rows_named_as_papers_name_them_are_scored(tmp_path):
    """Rows an unseen table might hold: a Llama 2 70B row on "A100-SXM4-80GB" that leaves the
    architecture and recomputation blank (the preset and the lightest recomputation that fits are
    taken, each said); an H200 row of "Llama 3.1 70B"; a model with no preset described by its
    columns; step-time and whole-job token and sample rates; and rows that cannot be read, each with
    its reason."""
    a100 = _write(tmp_path, [
        _row(model="Llama 2 70B", gpu="A100-SXM4-80GB", seq_len=4096, num_gpus=64, tp=8, pp=2, dp=4, micro_batch=1,
             global_batch=512, precision="bf16", zero_stage="1 (distributed optimizer)",
             measured_metric="tokens_per_sec_per_gpu", measured_value=450.0),
        _row(model="Llama 2 70B", gpu="TPU v4", seq_len=4096, num_gpus=64, tp=8, pp=2, dp=4, micro_batch=1,
             global_batch=512, precision="bf16", measured_metric="tokens_per_sec_per_gpu", measured_value=450.0)])
    cases, skipped = load_cases(a100)
    assert len(cases) == 1 and len(skipped) == 1 and "TPU v4" in skipped[0][2]
    c = cases[0]
    assert c.model.name == "llama2-70b" and c.cluster.accelerator.name == "a100-80g" and c.plan.zero == 1
    assert any("llama2-70b preset" in a for a in c.assumed)
    chosen = [a for a in c.assumed if a.startswith("recompute = ")]
    assert chosen and c.plan.recompute in chosen[0] and estimate(c.model, c.job, c.cluster, c.plan).feasible
    assert c.measured_step_time_s == pytest.approx(512 * 4096 / (450.0 * 64))

    h100 = _write(tmp_path, [
        _row(model="Llama 3.1 70B", gpu="H200", seq_len=8192, num_gpus=64, tp=4, pp=4, dp=4, cp_or_sp="cp1; sp",
             micro_batch=1, global_batch=128, precision="BF16", measured_metric="step_time", measured_unit="ms",
             measured_value=9000.0),
        _row(model="my-13b", layers=40, hidden=5120, heads=40, ffn_hidden=13824, vocab=32000, gpu="H100 SXM5",
             seq_len=4096, num_gpus=16, tp=2, pp=1, dp=8, micro_batch=2, global_batch=256, precision="fp8-ds",
             measured_metric="tokens_per_sec", measured_value=50_000.0),
        _row(model="Llama 3 8B", gpu="B200", seq_len=8192, num_gpus=8, tp=1, pp=1, dp=4, cp_or_sp="cp2 (ring)",
             micro_batch=1, global_batch=64, precision="FP8-MX", measured_metric="samples_per_sec", measured_value=4.0),
        _row(model="Llama 3 8B", gpu="B200", seq_len=8192, num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1,
             global_batch=64, precision="NVFP4", measured_metric="tokens_per_sec_per_gpu", measured_value=9000.0),
        _row(model="Falcon-180B", gpu="H100", seq_len=2048, num_gpus=64, tp=8, pp=1, dp=8, micro_batch=1,
             global_batch=64, precision="bf16", measured_metric="tokens_per_sec_per_gpu", measured_value=9000.0)])
    cases, skipped = load_h100_cases(h100)
    by_model = {c.model.name: c for c in cases}
    assert set(by_model) == {"llama3-70b", "my-13b", "llama3-8b"}
    assert by_model["llama3-70b"].cluster.accelerator.name == "h200"
    assert by_model["llama3-70b"].plan.sp and by_model["llama3-70b"].measured_step_time_s == pytest.approx(9.0)
    own = by_model["my-13b"]
    assert own.model.activation == "swiglu" and own.plan.dtype == "fp8-delayed" and own.model.rotary
    assert own.plan.engine == "generic" and not own.plan.tp_comm_overlap and not own.plan.grad_reduce_bf16
    assert any("engine = generic" in a for a in own.assumed)     # an unknown source gets no Megatron recipe
    assert own.measured_step_time_s == pytest.approx(256 * 4096 / 50_000.0)
    assert any("from the row's columns" in a for a in own.assumed)
    b200 = next(c for c in cases if c.plan.dtype == "mxfp8")
    assert b200.plan.cp == 2 and b200.measured_step_time_s == pytest.approx(64 / 4.0)
    # NVFP4 was refused ("'NVFP4' not understood") before issue 66: now read as the nvfp4 recipe
    nvfp4 = next(c for c in cases if c.plan.dtype == "nvfp4")
    assert nvfp4.cluster.accelerator.name == "b200" and nvfp4.plan.dp == 8
    reasons = sorted(reason for _, _, reason in skipped)
    assert len(reasons) == 1
    assert any("no preset for model 'Falcon-180B'" in r and "layers" in r for r in reasons)
    for c in cases:      # every read row is estimable
        assert estimate(c.model, c.job, c.cluster, c.plan).step_time_s > 0


def test_a_file_without_its_columns_or_with_unreadable_cells_says_which(tmp_path):
    """A file missing a required column is refused, naming it; a cell that is not a number skips its
    row with the cell's value, not the file; optional columns may be left out altogether."""
    from paraplan.errors import ConfigError
    bad = tmp_path / "bad.csv"
    pd.DataFrame([{"source": "s", "model": "Llama 3 8B", "gpu": "H100"}]).to_csv(bad, index=False)
    with pytest.raises(ConfigError) as e:
        load_h100_cases(bad)
    assert "num_gpus" in str(e.value) and "measured_value" in str(e.value)
    few = tmp_path / "few.csv"
    pd.DataFrame([dict(source="s", model="Llama 3 8B", gpu="H100", num_gpus=8, tp="eight", pp=1, dp=1,
                       micro_batch=1, global_batch=8, seq_len=8192, precision="bf16",
                       measured_metric="tokens_per_sec_per_gpu", measured_value=9000.0),
                  dict(source="s", model="Llama 3 8B", gpu="H100", num_gpus=8, tp=1, pp=1, dp=8,
                       micro_batch=1, global_batch=64, seq_len=8192, precision="bf16",
                       measured_metric="tokens_per_sec_per_gpu", measured_value=9000.0),
                  dict(source="s", model="Llama 3 8B", gpu="H100", num_gpus=8, tp="8 (guess)", pp=1, dp=1,
                       micro_batch=1, global_batch=8, seq_len=8192, precision="bf16", recompute="activation checkpointing",
                       measured_metric="tokens_per_sec_per_gpu", measured_value=9000.0)]).to_csv(few, index=False)
    cases, skipped = load_h100_cases(few)
    assert len(cases) == 2 and cases[0].cluster.accelerator.name == "h100-sxm"
    assert cases[1].plan.tp == 8 and cases[1].plan.recompute == "full"       # a number with its note is read
    assert len(skipped) == 1 and "'eight'" in skipped[0][2]


def test_offload_cells_are_read_and_move_the_run_to_deepspeed(tmp_path):
    """An offload cell puts the optimizer states (and, named, the parameters) on the CPU or NVMe, on
    DeepSpeed, whose ZeRO-Offload it is; the estimate then charges the transfers and the host optimizer."""
    from paraplan.calibration import offload_of_cell
    said = []
    assert offload_of_cell(None, said) == ("none", False) and offload_of_cell("none", said) == ("none", False)
    assert offload_of_cell("cpu (optimizer)", said) == ("cpu", False)
    assert offload_of_cell("NVMe params + optimizer", said) == ("nvme", True)
    assert offload_of_cell("somewhere", said) == ("none", False) and "not understood" in said[-1]
    path = _write(tmp_path, [_row(model="Llama 3 70B", gpu="H100", seq_len=4096, num_gpus=8, tp=1, pp=1, dp=8,
                                  micro_batch=1, global_batch=8, precision="bf16", zero_stage="3", offload="cpu",
                                  recompute="full", measured_metric="tokens_per_sec_per_gpu", measured_value=100.0)])
    (case,), skipped = load_h100_cases(path)
    assert not skipped and case.plan.offload == "cpu" and case.plan.engine == "deepspeed"
    e = estimate(case.model, case.job, case.cluster, case.plan)
    assert e.time_breakdown_s["offload"] > 0


def test_the_cli_takes_the_names_people_type(capsys):
    """`--model "Llama 3.1 70B"` and `--cluster "H100 SXM"` run as llama3-70b on dgx-h100 (the output
    names the presets); a part without a preset, an A100 without its memory size, and a near-miss
    preset name each get a one-line error (exit 2) saying why or what was meant."""
    import json
    from paraplan.cli import main
    args = ["--gpus", "16", "--tp", "4", "--pp", "2", "--format", "json"]
    assert main(["estimate", "--model", "Llama 3.1 70B", "--cluster", "H100 SXM", *args]) == 0
    spelled = json.loads(capsys.readouterr().out)
    assert main(["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", *args]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == spelled["step_time_s"]
    for cluster, words in (("H100 PCIe", "PCIe"), ("A100", "does not say which part"),
                           ("dgx-h10", "did you mean 'dgx-h100'")):
        assert main(["estimate", "--model", "llama3-8b", "--cluster", cluster]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["estimate", "--model", "llama3-7b", "--cluster", "dgx-h100"]) == 2
    assert "did you mean" in capsys.readouterr().err


def test_mfu_and_model_tflops_rows_convert_with_megatrons_flop_count():
    """An MFU figure is a share of the dense 16-bit peak over Megatron's model-FLOP count: Korthikanti
    et al.'s MFU (41.5, 51.4, 56.0, 56.3 %) gives back their Table 5 step times within 1 %; a model
    TFLOP/s figure is the same count per second per GPU. Their rows stay held out of the calibration."""
    from paraplan.calibration import (KORTHIKANTI_SETUPS, KORTHIKANTI_TABLE5_STEP_S, load_cases,
                                                 measured_step_time_s)
    from paraplan.hardware.catalog import load_cluster
    from paraplan.workloads.presets import load_model
    for name, mfu in (("22B", 41.5), ("175B", 51.4), ("530B", 56.0), ("1T", 56.3)):
        model, gpus, gbs, _ = KORTHIKANTI_SETUPS[name]
        model = load_model(model) if isinstance(model, str) else model
        peak = load_cluster("dgx-a100-80g", gpus).accelerator.peak_flops["bf16"]
        step = measured_step_time_s("mfu", mfu, "%", gbs, 2048, gpus, model, peak)
        assert step == pytest.approx(KORTHIKANTI_TABLE5_STEP_S[name][1], rel=0.01)
        tflops = mfu / 100 * peak / 1e12
        assert measured_step_time_s("tflops_per_gpu", tflops, "TFLOP/s/GPU", gbs, 2048, gpus, model) == pytest.approx(step)
    _, skipped = load_cases()
    assert sum("held out" in reason for _, _, reason in skipped) == 4


def test_a_year_in_a_source_name_does_not_make_it_megatron():
    """Source names map to the file's Megatron sources only when they name Megatron: an OPT or
    DeepSpeed paper from 2022 is not Korthikanti et al. (held out) nor gets Megatron 2020's defaults."""
    from paraplan.calibration import short_source
    assert short_source("OPT-175B logbook 2022") == "OPT-175B logbook 2022"
    assert short_source("ZeRO-Offload (Ren et al. 2021)") == "ZeRO-Offload (Ren et al. 2021)"
    assert short_source("megatron-lm-2020-images/tables.tex") == "Megatron-LM 2020"


def test_a_row_whose_stated_size_is_not_its_model_is_skipped(tmp_path):
    """params_b guards the reading: 'Llama 3 70B' with params_b 8 (a mislabelled row) or columns that
    make a 2B model for a row stating 13B are skipped with both sizes; a stated MoE size may be the
    total or the active one."""
    path = _write(tmp_path, [
        _row(model="Llama 3 70B", params_b=8, gpu="H100", seq_len=8192, num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1,
             global_batch=8, precision="bf16", measured_metric="tokens_per_sec_per_gpu", measured_value=900.0),
        _row(model="Mixtral 8x7B", params_b=12.9, gpu="H100", seq_len=4096, num_gpus=8, tp=1, pp=1, dp=8, ep=8,
             micro_batch=1, global_batch=8, precision="bf16", measured_metric="tokens_per_sec_per_gpu",
             measured_value=900.0)])
    cases, skipped = load_h100_cases(path)
    assert [c.model.name for c in cases] == ["mixtral-8x7b"]
    assert "read as llama3-70b (70.6B" in skipped[0][2] and "states 8B" in skipped[0][2]
    a100 = _write(tmp_path, [_row(model="my 13B", params_b=13, layers=24, hidden=2048, heads=16, vocab=50257,
                                  gpu="A100 80GB", seq_len=2048, num_gpus=8, tp=1, pp=1, dp=8, micro_batch=4,
                                  global_batch=32, precision="bf16", recompute="none",
                                  measured_metric="tokens_per_sec_per_gpu", measured_value=900.0)])
    cases, skipped = load_cases(a100)
    assert not cases and "states 13B" in skipped[0][2]


def test_an_unstated_recomputation_outside_nvidias_recipes_is_the_lightest_that_fits(tmp_path):
    """A run that ran fitted: a row of an unknown source that leaves recompute blank takes the lightest
    of none / selective / full whose estimate fits (said); a Megatron-Bridge row keeps its recipe's
    reading (none, or the recipe's modules)."""
    common = dict(model="Llama 3 70B", gpu="H100", seq_len=8192, num_gpus=32, tp=1, pp=1, dp=32, micro_batch=1,
                  global_batch=32, precision="bf16", zero_stage=3, measured_metric="tokens_per_sec_per_gpu",
                  measured_value=400.0)
    path = _write(tmp_path, [_row(**common), _row(**dict(common, source="Megatron-Bridge perf summary"))])
    (other, bridge), skipped = load_h100_cases(path)
    assert not skipped
    assert other.plan.recompute != "none" and estimate(other.model, other.job, other.cluster, other.plan).feasible
    assert any(a.startswith(f"recompute = {other.plan.recompute}") for a in other.assumed)
    assert bridge.plan.recompute == "none" and "no activation recomputation (not stated)" in bridge.assumed


def test_a_torchtitan_row_without_its_zero_stage_runs_fsdp(tmp_path):
    path = _write(tmp_path, [_row(source="torchtitan docs/performance.md", model="Llama 3 8B", gpu="H100",
                                  seq_len=8192, num_gpus=8, tp=1, pp=1, dp=8, micro_batch=1, global_batch=8,
                                  precision="bf16", recompute="none", measured_metric="tokens_per_sec_per_gpu",
                                  measured_value=6000.0)])
    (case,), _ = load_h100_cases(path)
    assert case.plan.engine == "torchtitan" and case.plan.zero == 3
    assert any(a.startswith("ZeRO-3 (FSDP2") for a in case.assumed)


def test_a100_rows_written_with_a_llama_shape_keep_its_attention_and_mlp(tmp_path):
    """The A100 file's columns describe GPT models (GELU MLP 4x wide, multi-head attention): a row
    naming Llama 2 70B with its shape takes the preset (8 KV heads, SwiGLU); an unknown model whose
    MLP is not 4x wide is read as SwiGLU; GPT rows stay as they were."""
    common = dict(gpu="A100 80GB", seq_len=4096, num_gpus=64, tp=8, pp=2, dp=4, micro_batch=1, global_batch=256,
                  precision="bf16", zero_stage=1, recompute="full", measured_metric="tokens_per_sec_per_gpu",
                  measured_value=400.0)
    path = _write(tmp_path, [
        _row(model="Llama-2-70B", layers=80, hidden=8192, heads=64, ffn_hidden=28672, vocab=32000, **common),
        _row(model="in-house 7B", layers=32, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000, **common),
        _row(model="GPT-1.7B (Megatron-LM 2021)", layers=24, hidden=2304, heads=24, vocab=51200, **common)])
    (llama, own, gpt), skipped = load_cases(path)
    assert not skipped
    assert llama.model.name == "llama2-70b" and llama.model.kv_heads == 8 and llama.model.activation == "swiglu"
    assert own.model.activation == "swiglu" and own.model.rotary and any("SwiGLU" in a for a in own.assumed)
    assert gpt.model.activation == "gelu" and gpt.model.name == "GPT-1.7B (Megatron-LM 2021)"


def test_a_model_described_by_columns_without_its_vocabulary_takes_the_notes_or_32k(tmp_path):
    common = dict(layers=32, hidden=4096, heads=32, ffn_hidden=14336, gpu="H100", seq_len=4096, num_gpus=8, tp=1,
                  pp=1, dp=8, micro_batch=1, global_batch=8, precision="bf16", recompute="none",
                  measured_metric="tokens_per_sec_per_gpu", measured_value=9000.0)
    path = _write(tmp_path, [_row(model="house-8b", **common),
                             _row(model="house-8b-big-vocab", **dict(common, notes="vocab ~128k"))])
    (plain, noted), skipped = load_h100_cases(path)
    assert not skipped and plain.model.vocab == 32000 and noted.model.vocab == 128000
    assert any(a.startswith("vocab = 32,000: not stated") for a in plain.assumed)


def test_an_a100_row_without_its_vocabulary_takes_gpts(tmp_path):
    path = _write(tmp_path, [_row(model="GPT 2.5B", layers=52, hidden=1920, heads=20, gpu="A100 80GB", seq_len=1024,
                                  num_gpus=8, tp=1, pp=1, dp=8, micro_batch=8, global_batch=64, precision="fp16",
                                  recompute="none", measured_metric="tokens_per_sec_per_gpu", measured_value=9000.0)])
    (case,), skipped = load_cases(path)
    assert not skipped and case.model.vocab == 51200 and case.assumed[0].startswith("vocab = 51,200")
