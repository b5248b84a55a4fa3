"""Launch configs from a plan file: Megatron-LM (bash + torchrun), DeepSpeed (config JSON), torchtitan
(a Python config registry for its 0.3.0 release; the TOML job config of 0.2.x behind a flag).

Each exporter is a pure function of a plan document (the dict ``read_plan_file`` returns) and returns
text for the engine release its spec names (``ExportMapping.target``, written in the header).

What is written is always a plan the engine runs, estimated: where the plan holds a choice the engine
does not run (optimizer offload on Megatron-LM, zb-h1 on a stock pipeline, op-level SAC outside
torchtitan, ...), the export is of the nearest plan it runs (``paraplan.planner.runnable``), estimated
with the same ``estimate`` and shown beside the plan's own estimate (:attr:`Export.summary`); a nearest
plan that does not fit is a ConfigError naming what overflows. Where the engine would run a *different
layout* (DeepSpeed with context parallelism, tp with pp, ...) the export is a ConfigError. What the
config itself cannot say (model code to adapt, a launcher to write) is a note: ``# NOTE:`` comments in
bash and Python output; JSON has no comments, so DeepSpeed notes come back in :attr:`Export.notes` (the
CLI prints them on stderr).

The engines' own configuration code checks the exports of a corpus covering every plan field
(benchmarks/engine_configs/check_exports.py, in CI); ``paraplan.planner.readers`` reads each export back
into a Plan. What is data about an engine's options (its switches' flags, fp8 recipes, schedules,
sharding strategies, the release it targets) is in its spec's ``export``
(``paraplan.engines.ExportMapping``); each builder here reads it from the spec it is given.
"""
from __future__ import annotations

import difflib
import json
import shlex
from dataclasses import replace
from typing import Any, Callable, Mapping

from paraplan.costmodels.kernels import FP4_BF16_LINEAR_SHARE
from paraplan.costmodels.memory import bf16_optimizer_layout
from paraplan.engines import EngineSpec, spec_named
from paraplan.errors import ConfigError
from paraplan.plan import (check_plan, interleaved_split_accounts, is_fp4, is_fp8, stage_layer_counts,
                           virtual_stage_layer_counts)
from paraplan.planner.export_common import (ENGINES, LEARNING_RATE, MTP_NOTE, NVME_PLACEHOLDER, RDZV_PORT,  # noqa: F401
                                            TRAIN_ITERS, Export, Scenario, headline, launch_note, load_scenario,
                                            sdpa_kernel_note)
from paraplan.planner.export_torchtitan import TORCHTITAN_FORMATS, build_torchtitan
from paraplan.planner.runnable import AsRun, as_engine_runs, nearest_runnable

#: Megatron-LM --cp-comm-type for each context-parallel mode (megatron/training/arguments.py: p2p, a2a,
#: allgather, a2a+p2p; Transformer Engine's attention: p2p is ring attention, a2a DeepSpeed-Ulysses)
MEGATRON_CP_COMM_TYPE = {"ring": "p2p", "ulysses": "a2a"}


# --- Megatron-LM -------------------------------------------------------------------------------------
def _torchrun_args(s: Scenario) -> list[str]:
    return ["--nnodes", str(s.hosts), "--nproc-per-node", str(s.procs_per_host),
            "--rdzv-id", "paraplan", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "${MASTER_ADDR}:${MASTER_PORT}"]


def _megatron_uneven_stages(s: Scenario) -> list[tuple[str, ...]]:
    """--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers for an uneven split
    (NVIDIA/Megatron-LM megatron/training/arguments.py; the layers left must divide evenly over the
    middle stages, megatron/core/transformer/transformer_config.py); the embedding / loss accounting
    flags for interleaved chunks that divide with them; otherwise (middle stages that differ, chunks
    no accounting divides) the chunks spelled out as a --pipeline-model-parallel-layout."""
    counts = stage_layer_counts(s.model.layers, s.plan)
    if len(set(counts)) == 1 and (s.plan.vpp == 1 or s.model.layers % (s.plan.pp * s.plan.vpp) == 0):
        return []
    if s.plan.vpp > 1:
        accounts = interleaved_split_accounts(s.model.layers, s.plan.pp, s.plan.vpp)
        if accounts is None:            # no accounting divides the layers: spell the chunks out
            return [("--pipeline-model-parallel-layout",
                     megatron_pipeline_layout(virtual_stage_layer_counts(s.model.layers, s.plan)))]
        embedding, loss = accounts      # interleaved: the embedding and/or loss counted as layers
        return ([("--account-for-embedding-in-pipeline-split",)] if embedding else []) + \
               ([("--account-for-loss-in-pipeline-split",)] if loss else [])
    middle = counts[1:-1]
    if len(set(middle)) > 1:            # --decoder-first/last-pipeline-num-layers cannot say it
        return [("--pipeline-model-parallel-layout", megatron_pipeline_layout(counts))]
    return [("--decoder-first-pipeline-num-layers", str(counts[0])),
            ("--decoder-last-pipeline-num-layers", str(counts[-1]))]


def megatron_pipeline_layout(chunk_layers: list[int]) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` for layer counts per model chunk in model
    order (pp * vpp chunks, chunk i on stage i mod pp): chunks separated by "|", "E" the embedding
    (first chunk), "L" the loss (last), "t*k" k transformer layers (Megatron-LM docs, "Custom Pipeline
    Model Parallel Layout": "Et*3|(tt|)*29,m|L")."""
    parts = [("t" if c == 1 else f"t*{c}" if c else "") for c in chunk_layers]
    parts[0] = "E" + ("," if parts[0] else "") + parts[0]
    parts[-1] = parts[-1] + ("," if parts[-1] else "") + "L"
    return "|".join(parts)


def megatron_moe_layer_freq(m) -> str | None:
    """Megatron-LM's ``--moe-layer-freq`` for the model's MoE layout (megatron/training/arguments.py: an
    integer N puts an MoE MLP on layers 0, N, 2N, ...; a Python list expression gives the pattern per
    layer): ``first_dense`` dense layers, then an MoE layer every ``every`` layers, the remainder dense —
    :attr:`TransformerModel.moe_layers` of them; None where every layer is MoE (Megatron's default)."""
    e = m.moe
    if e.first_dense == 0 and e.every == 1:
        return None
    rest = m.layers - e.first_dense
    return f"([0]*{e.first_dense}+([1]+[0]*{e.every - 1})*{rest // e.every}+[0]*{rest % e.every})"


def megatron_fp4_args(p, spec, layers: int, notes: list[str]) -> list[tuple[str, ...]]:
    """Megatron-LM's flags for an fp4 plan (NVIDIA/Megatron-LM @ 307dcf3 : megatron/training/arguments.py,
    _add_transformer_engine_args): ``--fp4-format e2m1 --fp4-recipe nvfp4`` (the recipe's only choice;
    Transformer Engine's NVFP4BlockScaling), the last round(FP4_BF16_LINEAR_SHARE x layers) layers in bf16
    (``--first-last-layers-bf16 --num-layers-at-start-in-bf16 0 --num-layers-at-end-in-bf16 N``: the share
    the estimate keeps in bf16, NVIDIA's NVFP4 recipe keeping mostly final layers high-precision,
    arXiv:2509.25149), and ``--fp4-param-gather`` for fp4 parameters (``plan.fp8_param_gather``)."""
    tail = max(1, round(FP4_BF16_LINEAR_SHARE * layers))
    args = [("--fp4-format", "e2m1"), ("--fp4-recipe", spec.export.fp8_recipes[p.dtype]),
            ("--first-last-layers-bf16",), ("--num-layers-at-start-in-bf16", "0"),
            ("--num-layers-at-end-in-bf16", str(tail))]
    notes.append(f"nvfp4: the last {tail} of {layers} layers run in bf16 (--num-layers-at-end-in-bf16 {tail}), the "
                 f"{100 * FP4_BF16_LINEAR_SHARE:g} % of linear GEMM work the estimate keeps in bf16 (NVIDIA's NVFP4 "
                 "recipe keeps about 16 % of the linear layers high-precision, arXiv:2509.25149); Transformer Engine's "
                 "NVFP4BlockScaling runs it on Blackwell (sm100+)")
    if p.fp8_param_gather:
        args.append(("--fp4-param-gather",))
    return args


def megatron_moe_args(m, p, notes: list[str]) -> list[tuple[str, ...]]:
    """The MoE flags of pretrain_gpt.py (megatron/training/arguments.py, Megatron-Core MoE README):
    experts, top-k, expert width, shared experts, the LatentMoE latent, which layers, expert parallelism, grouped GEMM and
    the fused permutation the estimate prices, the token dispatcher, capacity (token drop and pad)."""
    e = m.moe
    args: list[tuple[str, ...]] = [("--num-experts", str(e.experts)), ("--moe-router-topk", str(e.top_k)),
                                   ("--moe-ffn-hidden-size", str(e.expert_ffn_hidden))]
    if e.shared_experts:
        args.append(("--moe-shared-expert-intermediate-size", str(e.shared_experts * e.expert_ffn_hidden)))
    if e.latent_size:       # LatentMoE: TransformerConfig.moe_latent_size (megatron/core/transformer/moe/moe_layer.py)
        args.append(("--moe-latent-size", str(e.latent_size)))
    freq = megatron_moe_layer_freq(m)
    if freq:
        args.append(("--moe-layer-freq", freq))
    args += [("--expert-model-parallel-size", str(p.ep)), ("--expert-tensor-parallel-size", str(p.etp)),
             ("--moe-grouped-gemm",), ("--moe-permute-fusion",)]
    if not p.moe_flex_dispatch:
        args.append(("--moe-token-dispatcher-type", "alltoall"))
    if e.capacity_factor:
        args += [("--moe-expert-capacity-factor", f"{e.capacity_factor:g}"), ("--moe-pad-expert-input-to-capacity",)]
    if e.router_groups is not None:
        args += [("--moe-router-num-groups", str(e.router_groups)), ("--moe-router-group-topk", str(e.router_group_top_k))]
    if e.dispatch == "einsum":
        notes.append("the model's experts are priced with DeepSpeed-MoE's einsum dispatch; Megatron-LM permutes "
                     "tokens (grouped GEMM), which the estimate prices lower: re-estimate with the model's "
                     "dispatch set to permute for this script's step time")
    return args


def megatron_hybrid_args(m, notes: list[str]) -> list[tuple[str, ...]]:
    """A hybrid Mamba-2 / attention model's flags: pretrain_mamba.py (NVIDIA/Megatron-LM, MambaModel built by
    mamba_builders.py) reads the layer pattern and the Mamba mixer's shape (megatron/training/arguments.py
    --hybrid-override-pattern, --mamba-state-dim, --mamba-head-dim, --mamba-num-groups, --mamba-num-heads;
    megatron/core/ssm/mamba_mixer.py reads them as config.mamba_*); the MLP layers' squared ReLU is
    --squared-relu (Nemotron-H: NVIDIA/NeMo nemo/collections/llm/gpt/model/ssm.py NemotronHConfigBase)."""
    mb = m.mamba
    pattern = m.layer_pattern
    if getattr(m, "mtp_pattern", ""):
        # Megatron-LM's unified pattern: one "/"-separated copy of a depth's layers per depth, from which it infers
        # --mtp-num-layers (NVIDIA/Megatron-LM @ 00caa53 megatron/core/ssm/mamba_hybrid_layer_allocation.py
        # parse_hybrid_pattern; megatron/training/arguments.py converts the legacy --mtp-hybrid-override-pattern)
        pattern += "".join("/" + m.mtp_pattern for _ in range(m.mtp_layers))
        notes.append(f"multi-token prediction from hybrid layers ({m.mtp_layers} depth(s) of {m.mtp_pattern!r} after "
                     "'/' in --hybrid-override-pattern): a Megatron-LM with the unified hybrid pattern "
                     "(megatron/core/ssm/mamba_hybrid_layer_allocation.py MTP_SEPARATOR); core_v0.16.1's MambaModel "
                     "has no MTP"
                     + ("; the depths repeat one depth's layers: add --mtp-use-repeated-layer (that Megatron-LM's "
                        "flag)" if m.mtp_repeated else ""))
    args: list[tuple[str, ...]] = [("--hybrid-override-pattern", pattern)]
    if mb is not None:
        args += [("--mamba-num-heads", str(mb.heads)), ("--mamba-head-dim", str(mb.head_dim)),
                 ("--mamba-state-dim", str(mb.state)), ("--mamba-num-groups", str(mb.groups))]
        if mb.chunk != 128 or mb.conv_kernel != 4:
            notes.append(f"Mamba chunk {mb.chunk} / convolution kernel {mb.conv_kernel}: Megatron-LM's MambaMixer "
                         "fixes 128 and 4 (its constructor defaults), so the run uses those")
    notes.append("hybrid Mamba-2 / attention model: pretrain_mamba.py (needs mamba-ssm and causal-conv1d); "
                 "newer Megatron-LM releases also want --is-hybrid-model")
    return args


def build_megatron(s: Scenario, spec: EngineSpec) -> Export:
    """pretrain_gpt.py flags (NVIDIA/Megatron-LM megatron/training/arguments.py) behind torchrun; the
    switches' flags, fp8 recipes and Megatron-FSDP strategies from ``spec.export``."""
    p, m, notes = s.plan, s.model, []
    args: list[tuple[str, ...]] = [
        ("--num-layers", str(m.layers)), ("--hidden-size", str(m.hidden)),
        ("--ffn-hidden-size", str(m.ffn_hidden)), ("--num-attention-heads", str(m.heads)),
    ]
    if m.kv_heads != m.heads:
        args += [("--group-query-attention",), ("--num-query-groups", str(m.kv_heads))]
    if m.mla:     # latent attention: MLASelfAttention's widths (q_lora_rank 0: queries projected directly)
        args += [("--multi-latent-attention",)] + ([("--q-lora-rank", str(m.mla.q_lora_rank))] if m.mla.q_lora_rank else []) \
            + [("--kv-lora-rank", str(m.mla.kv_lora_rank)), ("--qk-head-dim", str(m.head_dim)),
               ("--qk-pos-emb-head-dim", str(m.mla.qk_rope_head_dim)), ("--v-head-dim", str(m.mla.v_head_dim))]
    elif m.q_hidden != m.hidden:
        args.append(("--kv-channels", str(m.head_dim)))     # head width when it is not hidden / heads
    if m.mtp_layers:     # multi-token prediction (DeepSeek-V3): Megatron-Core places it on the last stage
        args.append(("--mtp-num-layers", str(m.mtp_layers)))
    hybrid = bool(getattr(m, "layer_pattern", ""))
    if hybrid:
        args += megatron_hybrid_args(m, notes)
    args += [("--seq-length", str(s.seq_len)),
             ("--max-position-embeddings", str(max(s.seq_len, m.max_positions or 0))),
             ("--position-embedding-type", "learned_absolute" if m.learned_positions
              else "rope" if m.rotary or not hybrid else "none"),
             ("--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm")]
    if m.activation == "swiglu":
        args.append(("--swiglu",))
    elif m.activation == "relu" and hybrid:
        args.append(("--squared-relu",))
    elif m.activation == "relu":
        notes.append("the model uses ReLU; Megatron-LM has no plain-ReLU flag (--squared-relu is a different "
                     "function), so this script keeps Megatron's default GELU (same shapes and FLOPs)")
    if not m.bias:
        args.append(("--disable-bias-linear",))
    if not m.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights",))
    args += [("--vocab-size", str(m.vocab)), ("--tokenizer-type", "NullTokenizer"), ("--mock-data",)]
    if m.moe is not None:
        args += megatron_moe_args(m, p, notes)

    # parallel layout
    args += [("--tensor-model-parallel-size", str(p.tp)), ("--pipeline-model-parallel-size", str(p.pp)),
             ("--context-parallel-size", str(p.cp))]
    if p.cp > 1:     # Transformer Engine's context-parallel attention: p2p is ring attention, a2a Ulysses
        args.append(("--cp-comm-type", MEGATRON_CP_COMM_TYPE[p.cp_mode]))
    if p.sp:
        args.append(("--sequence-parallel",))
    uneven = _megatron_uneven_stages(s)
    args += uneven
    if p.schedule == "interleaved" and not any(a[0] == "--pipeline-model-parallel-layout" for a in uneven):
        args.append(("--num-layers-per-virtual-pipeline-stage",
                     str(max(virtual_stage_layer_counts(m.layers, p)))))
    args += [("--micro-batch-size", str(p.micro_batch)), ("--global-batch-size", str(s.global_batch))]

    # memory
    if p.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", "1")]
    elif p.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
        if p.recompute_modules:
            args.append(("--recompute-modules", *p.recompute_modules.split(",")))
    if p.zero >= 1:
        args.append(("--use-distributed-optimizer",))
    if p.zero >= 2:
        # Megatron-FSDP (Megatron-LM docs/discussions/megatron-fsdp-user-guide: its required flags, and
        # --fsdp-double-buffer, the persistent buffers the estimate prices); validate_args refuses it
        # with CUDA_DEVICE_MAX_CONNECTIONS=1 and with any checkpoint format but fsdp_dtensor
        args += [("--use-megatron-fsdp",),
                 ("--data-parallel-sharding-strategy", spec.export.fsdp_strategy[p.zero]),
                 ("--ckpt-format", "fsdp_dtensor"), ("--fsdp-double-buffer",)]
        notes.append(f"ZeRO-{p.zero} runs as Megatron-FSDP: leave CUDA_DEVICE_MAX_CONNECTIONS unset (Megatron-LM "
                     "refuses Megatron-FSDP with it at 1); with a Transformer Engine that cannot fuse gradient "
                     "accumulation under FSDP add --no-gradient-accumulation-fusion (Megatron-LM warns about it)")
    # no optimizer offload: the megatron engine keeps its optimizer states on the GPU (a plan with offload is
    # exported as its nearest plan without, paraplan.planner.runnable)
    if p.overlap_grad_reduce:
        args.append(("--overlap-grad-reduce",))
        if p.zero >= 1 and p.overlap_param_gather:   # the distributed optimizer's all-gather under the next forward
            args.append(("--overlap-param-gather",))
    args += switch_options(p, spec)     # --tp-comm-overlap, --overlap-moe-expert-parallel-comm, ...
    if p.precision_aware_optimizer and p.optimizer_state_dtype != "fp32":
        # both moments in one dtype (megatron/training/arguments.py _add_experimental_args); the master weights
        # stay fp32 (--main-params-dtype fp32, the default), kept as remainders under bf16 parameters
        args += [("--exp-avg-dtype", p.optimizer_state_dtype), ("--exp-avg-sq-dtype", p.optimizer_state_dtype)]
    if p.offload_activation_layers:
        args += [("--cpu-offloading",), ("--cpu-offloading-num-layers", str(p.offload_activation_layers))]
    if not p.grad_accumulation_fusion:
        args.append(("--no-gradient-accumulation-fusion",))
    args.append(("--fp16",) if p.dtype == "fp16" else ("--bf16",))
    if is_fp4(p.dtype):
        args += megatron_fp4_args(p, spec, s.model.layers, notes)
    elif is_fp8(p.dtype):
        if p.dtype == "fp8-rowwise":
            raise ConfigError("dtype", "Megatron-LM has no row-wise fp8 recipe (--fp8-recipe accepts tensorwise, "
                              "delayed, blockwise, mxfp8)", accepted="fp8, fp8-delayed, fp8-blockwise, mxfp8")
        args += [("--fp8-format", "hybrid"), ("--fp8-recipe", spec.export.fp8_recipes[p.dtype])]
        if p.fp8_param_gather:
            args.append(("--fp8-param-gather",))
    if p.flash_attention:
        if p.attention_kernel in ("efficient", "flash1"):
            which = ("PyTorch's memory-efficient one" if p.attention_kernel == "efficient" else
                     "FlashAttention 1.x (Transformer Engine needs flash-attn 2 or newer)")
            raise ConfigError("attention_kernel", "Megatron-LM's attention backends are Transformer Engine's fused "
                              f"(cuDNN) and flash kernels, not {which}", accepted="auto, cudnn, flash2")
        if p.attention_kernel == "auto":
            args.append(("--use-flash-attn",))
        else:   # Megatron-LM --attention-backend: fused = TE's cuDNN fused attention, flash = FlashAttention
            args.append(("--attention-backend", {"cudnn": "fused", "flash2": "flash"}[p.attention_kernel]))
    elif not p.fused_softmax:
        args.append(("--no-masked-softmax-fusion",))
    if not p.rope_fusion and m.rotary:
        args.append(("--no-rope-fusion",))
    args += [("--train-iters", str(TRAIN_ITERS)), ("--lr", f"{LEARNING_RATE:g}")]

    script = "pretrain_mamba.py" if hybrid else "pretrain_gpt.py"
    lines = ["#!/usr/bin/env bash",
             "# Megatron-LM launch script written by `paraplan export --to megatron`.",
             f"# Plan: {headline(s)}",
             f"# Targets {spec.export.target}: {script} of that Megatron-LM release.",
             "# Run the same script on every node with NODE_RANK unset (c10d rendezvous assigns ranks);",
             "# MASTER_ADDR is the host of the rendezvous (any one node). Extra arguments are passed to",
             f"# {script}, e.g. --data-path ... --tokenizer-type ... to replace the mock data.",
             *(f"# NOTE: {n}" for n in notes),
             "set -euo pipefail",
             *(["export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"] if p.expandable_segments else []),
             ': "${MEGATRON_LM:=/path/to/Megatron-LM}"',
             ': "${MASTER_ADDR:=localhost}"',
             f': "${{MASTER_PORT:={RDZV_PORT}}}"',
             "",
             "torchrun " + " ".join(_quote(a) for a in _torchrun_args(s)) + " \\",
             f'  "${{MEGATRON_LM}}/{script}" \\']
    lines += ["  " + " ".join(_quote(a) for a in group) + " \\" for group in args]
    lines.append('  "$@"')
    return Export(spec.label, "\n".join(lines) + "\n", notes, spec.export.notes_in_text, spec.export.target)


def switch_options(p, spec: EngineSpec) -> list[tuple]:
    """The options the engine writes for the plan's switches that are on (``spec.export.switch_options``,
    in its order)."""
    return [option for field_name, options in spec.export.switch_options if getattr(p, field_name)
            for option in options]


def _quote(arg: str) -> str:
    """shlex.quote, but keep ${VAR} references expandable (double quotes)."""
    return f'"{arg}"' if "${" in arg else shlex.quote(arg)


# --- DeepSpeed ---------------------------------------------------------------------------------------
def build_deepspeed(s: Scenario, spec: EngineSpec) -> Export:
    """A DeepSpeed config JSON (keys from deepspeed.ai/docs/config-json and deepspeed/runtime/config.py).

    Raises ConfigError for layouts a DeepSpeed config cannot express: context parallelism, Megatron
    sequence parallelism, TP together with PP (3D parallelism needs Megatron-DeepSpeed), ZeRO-2/3
    with PP (DeepSpeed's PipelineEngine asserts stage < 2), the interleaved schedule, and NVMe
    optimizer offload below ZeRO-3.
    """
    p, notes = s.plan, []
    if p.cp > 1:
        raise ConfigError("cp", f"DeepSpeed's config has no context-parallel setting (cp={p.cp}); use "
                          "Megatron-DeepSpeed (--ds-sequence-parallel-size, Ulysses) or export to megatron/torchtitan",
                          accepted="--to megatron or --to torchtitan")
    if p.sp:
        raise ConfigError("sp", "Megatron sequence parallelism is not a DeepSpeed config option; it needs "
                          "Megatron-DeepSpeed", accepted="--to megatron, or a plan without --sp")
    if p.tp > 1 and p.pp > 1:
        raise ConfigError("tp", f"tp={p.tp} with pp={p.pp} (3D parallelism) cannot be set from a DeepSpeed config; "
                          "it needs Megatron-DeepSpeed", accepted="--to megatron, or a plan with tp=1 or pp=1")
    if p.pp > 1 and p.zero >= 2:
        raise ConfigError("zero", f"DeepSpeed's PipelineEngine rejects ZeRO-{p.zero} with pipeline parallelism "
                          "(ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism)",
                          accepted="--zero 0 or 1 with pp > 1")
    if p.schedule == "interleaved":
        raise ConfigError("schedule", "DeepSpeed's pipeline engine has no interleaved (virtual-stage) schedule",
                          accepted="1f1b with pp > 1, or --to megatron / --to torchtitan")
    if p.offload == "nvme" and p.zero < 3:
        raise ConfigError("offload", f"DeepSpeed offloads optimizer states to NVMe only with ZeRO-3 (plan has "
                          f"ZeRO-{p.zero})", accepted="--offload cpu, or --zero 3 --offload nvme")

    cfg: dict[str, Any] = {
        "train_batch_size": s.global_batch,
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if is_fp8(p.dtype):
        raise ConfigError("dtype", f"DeepSpeed has no {p.dtype} training recipe of its own (fp8 and fp4 run through "
                          "Transformer Engine modules in the model code)", accepted="bf16, fp16")
    cfg["bf16" if p.dtype == "bf16" else "fp16"] = ({"enabled": True} if p.dtype == "bf16"
                                                    else {"enabled": True, "loss_scale": 0})
    if bool(bf16_optimizer_layout(p)):
        # the estimate prices DeepSpeed's BF16_Optimizer here (fp32 accumulation after every micro-batch);
        # with ZeRO-1 DeepSpeed picks it only when told to accumulate in fp32
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
        notes.append("bf16 with a pipeline or ZeRO-0: gradients accumulate in fp32 (data_types.grad_accum_dtype, "
                     "DeepSpeed's BF16_Optimizer), as the estimate prices it: 18 bytes per parameter of the stage "
                     "after every micro-batch, so fewer, larger micro-batches pay less")
    zero: dict[str, Any] = {"stage": p.zero}
    if p.zero >= 1:
        zero.update(overlap_comm=p.overlap_grad_reduce, contiguous_gradients=True)
    if p.offload != "none":
        off = {"device": p.offload, "pin_memory": True}
        if p.offload == "nvme":
            off["nvme_path"] = NVME_PLACEHOLDER
        zero["offload_optimizer"] = off
        if p.offload_params:
            zero["offload_param"] = dict(off)
    cfg["zero_optimization"] = zero
    if p.offload == "nvme":
        notes.append(f"set zero_optimization.*.nvme_path (now {NVME_PLACEHOLDER!r}) to a directory on a local "
                     "NVMe drive on every node")
    if p.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                           "contiguous_memory_optimization": False,
                                           "synchronize_checkpoint_boundary": False, "profile": False}
        notes.append("activation_checkpointing only configures deepspeed.checkpointing; the model code must "
                     "wrap its layers with deepspeed.checkpointing.checkpoint"
                     + (" (per layer for full recomputation)" if p.recompute == "full" else
                        "; selective recomputation means checkpointing only the attention core "
                        "(softmax/dropout), which the model code has to choose"))
    if p.pp > 1:
        cfg["pipeline"] = {"stages": p.pp, "partition": "parameters",
                           "activation_checkpoint_interval": 1 if p.recompute == "full" else 0}
        counts = stage_layer_counts(s.model.layers, p)
        if len(set(counts)) > 1:
            notes.append(f"the plan splits the layers unevenly {counts}; build the PipelineModule with "
                         "partition_method='type:<transformer layer class>' (balances the transformer layers "
                         "over the stages, DeepSpeed's own rounding) or 'uniform' (balances all layers, the "
                         "embedding and head included); neither pins the first and last stages' counts")
        notes.append(f"pipeline parallelism needs the model built as deepspeed.pipe.PipelineModule(num_stages={p.pp}) "
                     "and trained with engine.train_batch(); DeepSpeed runs its own 1F1B-style TrainSchedule"
                     + (f" (the plan's {p.schedule} schedule is not available)" if p.schedule != "1f1b" else ""))
    if p.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": p.tp}
        notes.append(f"tp={p.tp} maps to DeepSpeed AutoTP training (tensor_parallel.autotp_size, recent DeepSpeed "
                     "releases, Hugging Face-style models); for Megatron-style tensor parallelism use "
                     "Megatron-DeepSpeed or --to megatron")
    if p.flash_attention:
        notes.append("flash attention is chosen by the model code (e.g. attn_implementation='flash_attention_2'), "
                     "not by the DeepSpeed config")
        notes += sdpa_kernel_note(p, "a Hugging Face model with attn_implementation='sdpa'")
    if s.model.moe is not None:
        e = s.model.moe
        notes.append(f"experts are built in the model code, not by the DeepSpeed config: deepspeed.moe.layer.MoE("
                     f"num_experts={e.experts}, ep_size={s.plan.ep}, k={e.top_k}"
                     + (f", capacity_factor={e.capacity_factor:g}, drop_tokens=True" if e.capacity_factor else
                        ", drop_tokens=False") + f") in each of the {s.model.moe_layers} MoE layers"
                     + (f"; its gate has no group-limited routing, which the estimate prices ({e.router_group_top_k} "
                        f"of {e.router_groups} expert groups a token): re-estimate the model without router_groups"
                        if e.group_limited else ""))
    if s.model.mtp_layers:
        notes.append(MTP_NOTE.format(engine=spec.title))
    notes.append(f"launch: deepspeed --num_nodes {s.hosts} --num_gpus {s.procs_per_host} --hostfile HOSTFILE "
                 "train.py, where train.py passes this file to deepspeed.initialize(config=...)")
    return Export(spec.label, json.dumps(cfg, indent=2) + "\n", notes, spec.export.notes_in_text, spec.export.target)


# --- public API ---------------------------------------------------------------------------------------
_BUILDERS: dict[str, Callable[[Scenario, EngineSpec], Export]] = {
    "megatron": build_megatron, "deepspeed": build_deepspeed, "torchtitan": build_torchtitan}
if set(_BUILDERS) != set(ENGINES):
    raise AssertionError("paraplan.planner.export: one builder per engine spec with an export mapping")


def export(doc: Mapping[str, Any], engine: str, source: str = "plan", torchtitan_format: str = "python") -> Export:
    """Export a plan document for one engine: the nearest plan the engine runs, for the release its spec
    targets (``torchtitan_format``: ``python`` for torchtitan 0.3.0, ``toml`` for 0.2.x). ConfigError for
    unknown engines or formats, layouts the engine cannot run, and nearest plans that do not fit."""
    build = _BUILDERS.get(engine)
    if build is None:
        close = difflib.get_close_matches(engine, ENGINES, n=1, cutoff=0.6)
        raise ConfigError("--to", f"unknown engine {engine!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
                          accepted=", ".join(ENGINES))
    if torchtitan_format not in TORCHTITAN_FORMATS:
        raise ConfigError("--torchtitan-format", f"unknown format {torchtitan_format!r}",
                          accepted=", ".join(TORCHTITAN_FORMATS))
    scenario = load_scenario(doc, source)
    if scenario.plan.dtype == "fp32":
        raise ConfigError("dtype", "fp32 plans (validation on CPU) are not exported", accepted="bf16, fp16")
    titan = TORCHTITAN_FORMATS[torchtitan_format] if engine == "torchtitan" else None
    fp8 = titan.fp8_recipes if titan else None
    kernels = titan.attention_kernels if titan else None
    expert_tp = titan.expert_tensor_parallel if titan else None
    spec = spec_named(engine)

    def write(plan) -> Export:
        s = replace(scenario, plan=plan)
        return build(s, spec, torchtitan_format) if engine == "torchtitan" else build(s, spec)

    # a layout the engine cannot run (DeepSpeed with context parallelism, ...) is refused as such before
    # its memory is looked at: the nearest plan is written once without the estimate, which raises it
    nearest, _ = nearest_runnable(scenario.plan, engine, fp8, expert_tp, kernels)
    try:
        nearest = check_plan(nearest, scenario.model, scenario.job, scenario.cluster)
    except ConfigError:
        pass                     # as_engine_runs says which rule it breaks
    else:
        write(nearest)
    run = as_engine_runs(scenario.plan, engine, scenario.model, scenario.job, scenario.cluster, fp8_recipes=fp8,
                         expert_tp=expert_tp, attention_kernels=kernels)
    scenario = replace(scenario, plan=run.runs)
    out = write(run.runs)
    out.summary, out.plan = run.summary(), run.runs
    out.target = out.target or spec.export.target
    first = [_estimate_note(run)] + [n for n in (launch_note(scenario),) if n]
    if run.runs.expandable_segments:
        first.append("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the job's environment: the estimate "
                     "counts no allocator fragmentation under it")
    out.notes[:0] = first
    if out.notes_in_text:              # the script and the Python / TOML config carry their notes as comments
        lines = out.text.split("\n")
        at = next((i + 1 for i, line in enumerate(lines) if line.startswith("# Plan:")), 1)
        lines[at:at] = ["# NOTE: " + n for n in first]
        out.text = "\n".join(lines)
    return out


def _estimate_note(run: AsRun) -> str:
    """The first note: both estimates, and whether the export is the plan itself or its nearest runnable."""
    if run.same:
        return f"the plan as {run.engine} runs it: {run.summary()}"
    return (f"{run.engine} does not run every choice of this plan; this is the nearest plan it runs, "
            f"re-estimated: {run.summary()}")


def to_megatron(doc: Mapping[str, Any]) -> str:
    """A bash script: torchrun + Megatron-LM pretrain_gpt.py with the plan's flags."""
    return export(doc, "megatron").text


def to_deepspeed(doc: Mapping[str, Any]) -> str:
    """A DeepSpeed config JSON (no comments; see :func:`export_notes` for what it leaves to the user)."""
    return export(doc, "deepspeed").text


def to_torchtitan(doc: Mapping[str, Any], torchtitan_format: str = "python") -> str:
    """A torchtitan 0.3.0 Python config registry (``toml``: a torchtitan 0.2.x TOML job config)."""
    return export(doc, "torchtitan", torchtitan_format=torchtitan_format).text


def export_notes(doc: Mapping[str, Any], engine: str) -> list[str]:
    """What the export approximates or leaves to the user, one sentence each."""
    return export(doc, engine).notes
