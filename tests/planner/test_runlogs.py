"""Real training logs read into runs (issue 65): one real file per kind under tests/data/logs/ (where each
came from: tests/data/logs/README.md), its configuration read into the plan and its measurement into
the median of the steps after the warm-up, golden numbers taken from the files; and the one-line errors
for a log without its configuration, a truncated log, an unknown format, and what the user must add."""
import gzip
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.calibration import FILE_COLUMNS
from paraplan.errors import ConfigError
from paraplan.planner.readers import read_torchtitan_sections
from paraplan.planner.runlogs import KINDS, Overrides, case_of, detect_kind, read_run_log
from paraplan.planner.runlogs import torchtitan as titan

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
MEGATRON = LOGS / "megatron_deepspeed_llama_tp2pp2.log"
MEGATRON_NO_ARGS = LOGS / "megatron_llama2_3p5b_4090_no_arguments.log"
MLPERF = LOGS / "mlperf_v4.0_nvidia_eos_n64_gpt3_result_0.txt"
DEEPSPEED = LOGS / "deepspeed_0.19.8_cpu_zero1_dp2.log"
DEEPSPEED_GPU = LOGS / "deepspeed_fate_gpt2_zero2_excerpt.log"
TINY_MODEL = LOGS / "deepspeed_cpu_tiny_model.yaml"
TITAN_STEPS = LOGS / "torchtitan_pr1437_flex_debug_steps.log"
TITAN_MESH = LOGS / "torchtitan_pr1349_fsdp8_debug_steps.log"
TITAN_CONFIG = LOGS / "torchtitan_0.3.0_llama3_8b_tp2_config.log.gz"
#: what the NVIDIA v4.0 gpt3 submission's config_DGXH100_64x8x128x4x8_mbs2.sh sets (the log prints none of it)
MLPERF_LAYOUT = {"tp": 4, "pp": 8, "vpp": 4, "micro_batch": 2, "dtype": "fp8-delayed"}


@pytest.mark.parametrize("path, kind", [(MEGATRON, "megatron"), (MEGATRON_NO_ARGS, "megatron"), (MLPERF, "mlperf"),
                                        (DEEPSPEED, "deepspeed"), (DEEPSPEED_GPU, "deepspeed"), (TITAN_STEPS, "torchtitan"),
                                        (TITAN_MESH, "torchtitan")])
def test_each_kind_is_detected_from_its_content(path, kind):
    assert detect_kind(path.read_text()) == kind
    assert detect_kind(gzip.decompress(TITAN_CONFIG.read_bytes()).decode()) == "torchtitan"


def test_megatron_log_reads_its_arguments_and_iterations():
    log = read_run_log(MEGATRON, overrides=Overrides(gpu="A100-80GB"))
    p = log.plan
    assert (log.kind, log.engine, p.tp, p.pp, p.dp, p.micro_batch, p.dtype, p.recompute) == \
        ("megatron", "megatron", 2, 2, 2, 4, "fp16", "none")
    assert not p.flash_attention and p.zero == 0                 # use_flash_attn False; zero_stage 0
    m = log.model
    assert (m.layers, m.hidden, m.heads, m.ffn_hidden, m.vocab) == (24, 2048, 16, 5504, 32000)   # padded vocab 32000
    assert m.activation == "swiglu" and m.norm == "rmsnorm" and not m.tied_embeddings and m.rotary and not m.bias
    assert (log.gpus, log.seq_len, log.global_batch) == (8, 2048, 32)
    assert log.skipped == (1, 2) and log.measured.steps == (3, 2498, 2499, 2500)
    assert log.measured.step_time_s == pytest.approx(statistics.median([1.2502, 1.2103, 1.2054, 1.2064]))
    assert log.measured.tflops_per_gpu == pytest.approx(statistics.median([57.34, 59.23, 59.47, 59.42]))
    assert any("Megatron-DeepSpeed" in n for n in log.notes)
    row = log.row
    assert set(row) == set(FILE_COLUMNS)
    assert (row["measured_metric"], row["tp"], row["pp"], row["dp"], row["num_gpus"], row["gpu"]) == \
        ("step_time", 2, 2, 2, 8, "A100-80GB")
    assert "warm-up 1, 2 skipped" in row["notes"]
    case = case_of(log)
    assert case.measured_step_time_s == log.measured.step_time_s and case.cluster.num_gpus == 8


def test_megatron_log_reads_the_optimizer_dtypes_it_prints_as_torch_dtypes():
    """Megatron-LM's validate_args maps --exp-avg-dtype bf16 to torch.bfloat16 before the arguments block is
    printed (dtype_map in megatron/training/arguments.py): the reader maps it back."""
    from paraplan.planner.runlogs import megatron as M
    text = MEGATRON.read_text().replace(
        "  use_distributed_optimizer ....................... False\n",
        "  use_distributed_optimizer ....................... True\n"
        "  use_precision_aware_optimizer ................... True\n"
        "  exp_avg_dtype ................................... torch.bfloat16\n"
        "  exp_avg_sq_dtype ................................ torch.bfloat16\n")
    assert "torch.bfloat16" in text
    flags = M.flags_of(M.arguments(text))
    assert flags[flags.index("--exp-avg-dtype") + 1] == "bf16"
    read = M.read_megatron_args(flags)
    assert read.plan.precision_aware_optimizer and read.plan.optimizer_state_dtype == "bf16"
    assert not read.unexpressed


def test_megatron_log_without_its_arguments_is_one_clear_error():
    """A real Megatron-LM log that starts after the arguments (4090 best-practice page): ten iteration
    lines and memory reports, no configuration."""
    with pytest.raises(ConfigError) as e:
        read_run_log(MEGATRON_NO_ARGS, overrides=Overrides(gpu="A100-80GB"))
    text = str(e.value)
    assert "no arguments block" in text and "10 iteration lines" in text and "\n" not in text


def test_megatron_log_names_what_the_user_must_add_and_checks_what_they_add():
    with pytest.raises(ConfigError, match=r"GPU type; give --gpu"):
        read_run_log(MEGATRON)
    with pytest.raises(ConfigError, match=r"layers 24 \(the model: 32\)"):
        read_run_log(MEGATRON, overrides=Overrides(gpu="A100-80GB", model="llama2-7b"))
    with pytest.raises(ConfigError, match="states tp 2, but --tp 4 was given"):
        read_run_log(MEGATRON, overrides=Overrides(gpu="A100-80GB", layout={"tp": 4}))


def test_truncated_logs_say_so():
    text = MEGATRON.read_text()
    with pytest.raises(ConfigError, match="no end line"):
        read_run_log(text[:text.index("-------------------- end of arguments")], kind="megatron")
    head = text[:text.index(" iteration        3/")]
    with pytest.raises(ConfigError, match="all within the warm-up of 2"):
        read_run_log(head, overrides=Overrides(gpu="A100-80GB"))
    assert read_run_log(head, overrides=Overrides(gpu="A100-80GB", warmup=1)).measured.steps == (2,)
    with pytest.raises(ConfigError, match="no 'step: ... tps: ...' lines"):
        read_run_log(TITAN_CONFIG)


def test_mlperf_result_log_reads_its_submission_and_blocks():
    with pytest.raises(ConfigError, match="tensor-parallel degree.*config_.*give --tp N"):
        read_run_log(MLPERF)
    with pytest.raises(ConfigError, match="precision.*--dtype"):
        read_run_log(MLPERF, overrides=Overrides(layout={"tp": 4, "pp": 8}))
    log = read_run_log(MLPERF, overrides=Overrides(layout=MLPERF_LAYOUT))
    assert (log.gpu, log.gpus, log.global_batch, log.seq_len, log.model.name) == \
        ("NVIDIA H100-SXM5-80GB", 512, 2304, 2048, "gpt3-175b")
    assert (log.plan.tp, log.plan.pp, log.plan.dp, log.plan.vpp, log.plan.schedule, log.engine) == \
        (4, 8, 16, 4, "interleaved", "megatron")
    # blocks of 51,904,512 tokens = 11 steps of 2304 x 2048; the first block is the warm-up
    blocks_ms = [119949, 119865, 119885, 119887, 119859]
    assert log.skipped == (1,) and log.measured.steps == (2, 3, 4, 5, 6)
    assert log.measured.step_time_s == pytest.approx(statistics.median(blocks_ms) / 1000 / 11)
    assert log.measured.tokens_per_s_per_gpu == pytest.approx(2304 * 2048 / log.measured.step_time_s / 512)


def test_a_log_without_its_configuration_runs_the_lightest_memory_settings_that_fit():
    """The MLPerf result log states no optimizer sharding, gradient or parameter precision; the run ran on
    80 GB H100s, so it fitted. As read, ZeRO-0 with fp32 gradient buffers and 16-bit weights beside the fp8
    copies estimates 94 GiB (DOES NOT FIT); the lightest settings Megatron-LM offers until it fits are the
    distributed optimizer, bf16 gradient reduction and fp8 parameters (NVIDIA's run_and_time.sh sets
    USE_DIST_OPTIMIZER=True), each said; a setting the user gives is kept as given."""
    from paraplan.costmodels.estimate import estimate
    log = read_run_log(MLPERF, overrides=Overrides(layout=MLPERF_LAYOUT))
    case = case_of(log)
    assert (log.plan.zero, log.plan.grad_reduce_bf16, log.plan.fp8_param_gather) == (1, True, True)
    assert estimate(case.model, case.job, case.cluster, case.plan).feasible
    assert not estimate(case.model, case.job, case.cluster, replace(case.plan, zero=0, grad_reduce_bf16=False,
                                                                        fp8_param_gather=False)).feasible
    assert any("not stated by the source, and the run fitted" in n for n in log.notes)
    stated = read_run_log(MLPERF, overrides=Overrides(layout={**MLPERF_LAYOUT, "zero": 0, "recompute": "none"}))
    assert stated.plan.zero == 0 and stated.plan.recompute == "none"


def test_deepspeed_log_reads_its_json_config_and_throughput_timer():
    with pytest.raises(ConfigError, match="model's architecture.*--model"):
        read_run_log(DEEPSPEED)
    with pytest.raises(ConfigError, match="sequence length; give --seq-len"):
        read_run_log(DEEPSPEED, overrides=Overrides(model=str(TINY_MODEL), gpu="H100-SXM"))
    log = read_run_log(DEEPSPEED, overrides=Overrides(model=str(TINY_MODEL), gpu="H100-SXM", seq_len=64))
    p = log.plan
    assert (log.engine, p.zero, p.dp, p.micro_batch, p.dtype, log.gpus, log.global_batch) == \
        ("deepspeed", 1, 2, 4, "fp32", 2, 16)
    # timer lines from global_step 3; steps 3 and 4 are the warm-up; step = train_batch_size / CurrSamplesPerSec
    assert log.skipped == (3, 4) and log.measured.steps == tuple(range(5, 13))
    assert log.measured.step_time_s == pytest.approx(0.16133956773376465)
    assert log.measured.peak_memory_gib == pytest.approx(0.48)


def test_a_public_deepspeed_excerpt_with_only_the_configs_json_line():
    """FATE's DeepSpeed-on-Eggroll page (GPT-2, ZeRO-2, one GPU): the print's last lines and four timer
    lines, two of them broken by the page ('MemA          llocated')."""
    given = Overrides(model=str(LOGS / "gpt2_small_model.yaml"), gpu="A100-80GB", seq_len=128)
    with pytest.raises(ConfigError, match="GPU count; give --gpus N"):
        read_run_log(DEEPSPEED_GPU, overrides=given)
    log = read_run_log(DEEPSPEED_GPU, overrides=replace(given, gpus=1))
    assert (log.plan.zero, log.plan.dp, log.plan.micro_batch, log.plan.dtype, log.global_batch) == (2, 1, 16, "fp32", 16)
    assert log.skipped == (10, 20) and log.measured.steps == (30, 40)
    assert log.measured.step_time_s == pytest.approx(statistics.median([16 / 110.59852763526753,
                                                                        16 / 109.53330286609649]))
    assert log.measured.peak_memory_gib == pytest.approx(6.12)


def test_torchtitan_step_lines_and_the_layout_when_no_config_is_printed():
    with pytest.raises(ConfigError, match="prints no job config.*--debug.print_config"):
        read_run_log(TITAN_STEPS)
    given = Overrides(layout={"tp": 1}, gpus=8, gpu="H100-SXM", seq_len=2048, global_batch=64, model="llama3-8b")
    log = read_run_log(TITAN_STEPS, overrides=given)
    assert log.skipped == (3, 4) and log.measured.steps == (5, 6, 7, 8, 9, 10)
    assert log.measured.tokens_per_s_per_gpu == pytest.approx(statistics.median([34824, 34852, 34692, 34879, 33464,
                                                                                 34574]))
    assert log.measured.mfu_pct == pytest.approx(0.36) and log.measured.tflops_per_gpu == pytest.approx(3.565)
    assert log.measured.step_time_s == pytest.approx(64 * 2048 / (log.measured.tokens_per_s_per_gpu * 8))
    assert log.plan.engine == "torchtitan" and log.plan.zero == 3
    mesh = read_run_log(TITAN_MESH, overrides=Overrides(layout={"tp": 1}, gpu="H100-SXM", seq_len=2048,
                                                        global_batch=64, model="llama3-8b"))
    assert mesh.gpus == 8 and mesh.measured.steps == (3,) and mesh.measured.peak_memory_gib == pytest.approx(2.66)


def test_torchtitan_printed_config_reads_into_the_plan_and_model():
    """The job config torchtitan 0.3.0's own config code prints (--debug.print_config) for its llama3_8b
    config with --parallelism.tensor_parallel_degree 2 --training.local_batch_size 2 --training.global_batch_size 64."""
    cfg = titan.printed_config(gzip.decompress(TITAN_CONFIG.read_bytes()).decode())
    mode, note = titan.activation_policy(cfg["activation_checkpoint"])
    assert mode == "selective" and "SelectiveAC" in note
    read = read_torchtitan_sections(cfg, mode)
    assert (read.plan.tp, read.plan.pp, read.plan.zero, read.plan.recompute, read.seq_len, read.global_batch) == \
        (2, 1, 3, "op-sac", 8192, 64)
    model, preset, shape = titan.model_from_spec(cfg["model_spec"])
    assert preset == "llama3-8b"
    assert shape == {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "vocab": 128256}
    assert model.kv_heads == 8 and model.activation == "swiglu"


def test_unknown_format_and_kind_name_the_kinds_accepted(tmp_path):
    other = tmp_path / "train.log"
    other.write_text("epoch 1 loss 2.3\nepoch 2 loss 2.1\n")
    with pytest.raises(ConfigError) as e:
        read_run_log(other)
    assert all(k in str(e.value) for k in KINDS)
    with pytest.raises(ConfigError, match="unknown kind 'nemo'"):
        read_run_log(MEGATRON, kind="nemo")
    with pytest.raises(ConfigError, match="no such file"):
        read_run_log(tmp_path / "missing.log")
    with pytest.raises(ConfigError, match="arguments block"):
        read_run_log(TITAN_STEPS, kind="megatron")


@pytest.mark.parametrize("find, put", [("num_layers ......................................", "0x10"),
                                       ("num_layers ......................................", "9" * 30)])
def test_a_value_the_reader_cannot_take_is_one_error_naming_the_log(find, put):
    """Found by benchmarks/fuzz_cli.py: a log whose --num-layers reads '0x10' raised ValueError from int(), one
    with 30 digits OverflowError from the plan's rules; both are now one ConfigError naming the log."""
    lines = MEGATRON.read_text(encoding="utf-8").splitlines(keepends=True)
    k = next(i for i, ln in enumerate(lines) if find in ln)
    lines[k] = lines[k].rsplit(" ", 1)[0] + " " + put + "\n"
    with pytest.raises(ConfigError) as e:
        read_run_log("".join(lines), overrides=Overrides(gpu="A100-80GB"))
    assert e.value.field == "--log" or "log" in e.value.field
