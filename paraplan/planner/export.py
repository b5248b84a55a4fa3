"""Launch configs from a plan file: Megatron-LM (bash + torchrun), DeepSpeed (config JSON), torchtitan (TOML).

Each exporter is a pure function of a plan document (the dict ``read_plan_file`` returns) and returns
text. Choices an engine cannot express exactly are handled one of two ways, always visibly:

* **closest supported setting plus a note** when the job still runs with the same layout and only a
  secondary property changes (e.g. ``zb-h1`` runs as 1F1B on stock Megatron-LM; NVMe offload as
  Megatron's CPU optimizer offload). Notes appear as ``# NOTE:`` comments in bash and TOML output;
  JSON has no comments, so DeepSpeed notes come back from :func:`export_notes` (the CLI prints
  them on stderr).
* **ConfigError** when the engine would run a different layout than the plan (e.g. DeepSpeed with
  context parallelism, or ZeRO-2/3 together with DeepSpeed pipeline parallelism, which its
  PipelineEngine rejects; torchtitan with fp16 or NVMe offload).

Option names come from the engines' own sources, recorded with their commits in
``tests/data/engine_options.yaml``; ``tests/planner/test_export.py`` checks every emitted name against it.
What is data about an engine's options (its switches' flags, fp8 recipes, schedules, sharding
strategies, whether the text carries its notes) is in its spec's ``export``
(``paraplan.engines.ExportMapping``); each builder here reads it from the spec it is given.
"""
from __future__ import annotations

import difflib

import json
import shlex
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Callable, Mapping

from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.memory import bf16_optimizer_layout
from paraplan.costmodels.kernels import FP4_BF16_LINEAR_SHARE
from paraplan.engines import SPECS, EngineSpec, spec_named
from paraplan.errors import ConfigError
from paraplan.plan import (Plan, check_plan, interleaved_split_accounts, is_fp4, is_fp8, stage_layer_counts,
                           virtual_stage_layer_counts)
from paraplan.planfile import PLAN_SCHEMA
from paraplan.scenario import load_cluster
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

ENGINES = tuple(s.label for s in SPECS if s.export is not None)     # the engines paraplan writes configs for
RDZV_PORT = 29500
NVME_PLACEHOLDER = "/CHANGE_ME/local_nvme"     # DeepSpeed's documented default is /local_nvme
UNFUSED_ACCUMULATION_NOTE = ("the plan's estimate assumed gradient accumulation fused into the weight-gradient "
                             "GEMMs (Megatron-LM); {engine} adds each micro-batch's gradients with separate "
                             "kernels: re-estimate with --no-grad-accumulation-fusion for its step time")
EP_OVERLAP_NOTE = ("the plan's estimate hides the expert-parallel all-to-alls under the neighbouring micro-batch "
                   "(Megatron-Core's combined 1F1B, --overlap-moe-expert-parallel-comm); {engine} has no such "
                   "schedule: re-estimate without --ep-comm-overlap for its step time")
FLEX_DISPATCH_NOTE = ("the plan's estimate prices DeepEP / HybridEP dispatch (Megatron-Core's flex token dispatcher, "
                      "--moe-token-dispatcher-type flex); {engine} runs its all-to-all dispatch: re-estimate without "
                      "--moe-flex-dispatch for its step time")
TRAIN_ITERS = 100                              # a smoke-test length; override on the command line
LEARNING_RATE = 1.0e-4


@dataclass(frozen=True)
class Scenario:
    """What an exporter needs: the checked plan (dp filled) and the job around it."""
    plan: Plan
    model: Any                      # TransformerModel
    model_spec: str
    cluster_spec: str
    cluster: Any                    # Cluster, resolved from cluster_spec for the plan's GPU count
    seq_len: int
    global_batch: int

    @property
    def gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def hosts(self) -> int:
        """Hosts the launcher starts on (torchrun --nnodes, deepspeed --num_nodes): DGX nodes, NVL72
        compute trays (``Cluster.num_hosts``), not NVLink domains."""
        return self.cluster.num_hosts

    @property
    def procs_per_host(self) -> int:
        """Ranks per host (torchrun --nproc-per-node, deepspeed --num_gpus): ``Cluster.gpus_per_host``."""
        return self.cluster.gpus_per_host

    @property
    def job(self) -> TrainingJob:
        return TrainingJob(self.seq_len, self.global_batch)

    @property
    def grad_accum(self) -> int:
        """Micro-batches per data-parallel rank per optimizer step."""
        return self.global_batch // (self.plan.dp * self.plan.micro_batch)


@dataclass
class Export:
    """Text for one engine and the notes on what was approximated; ``notes_in_text``: the text carries
    them as comments (bash, TOML), else the caller shows them (JSON has no comments)."""
    engine: str
    text: str
    notes: list[str] = field(default_factory=list)
    notes_in_text: bool = True


# --- reading the document ---------------------------------------------------------------------------
def load_scenario(doc: Mapping[str, Any], source: str = "plan") -> Scenario:
    """Validate a plan document and resolve its model and cluster (ConfigError on any problem)."""

    if not isinstance(doc, Mapping) or doc.get("schema") != PLAN_SCHEMA:
        raise ConfigError("schema", f"not a paraplan plan document (expected schema {PLAN_SCHEMA!r})",
                          source=source)
    sc, raw_plan = doc.get("scenario"), doc.get("plan")
    for key, value in (("scenario", sc), ("plan", raw_plan)):
        if not isinstance(value, Mapping):
            raise ConfigError(key, "missing or not a mapping", source=source)
    missing = [k for k in ("model", "cluster", "gpus", "seq_len", "global_batch") if sc.get(k) in (None, "")]
    if missing:
        raise ConfigError(f"scenario.{missing[0]}", "missing", source=source,
                          accepted="scenario with model, cluster, gpus, seq_len, global_batch")
    for key in ("gpus", "seq_len", "global_batch"):
        v = sc[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"scenario.{key}", f"must be a positive integer, got {v!r}", source=source)
    model = load_model(str(sc["model"]))
    cluster = load_cluster(str(sc["cluster"]), sc["gpus"])
    plan = check_plan(Plan.from_dict(raw_plan, source=source), model,
                      TrainingJob(sc["seq_len"], sc["global_batch"]), cluster)
    return Scenario(plan=plan, model=model, model_spec=str(sc["model"]), cluster_spec=str(sc["cluster"]),
                    cluster=cluster,
                    seq_len=sc["seq_len"], global_batch=sc["global_batch"])


def _domains(s: Scenario) -> str:
    """", in NVLink domains of N GPUs" where a host is not a whole NVLink domain (NVL72), else ""."""
    c = s.cluster
    if c.system.gpus_per_host == c.system.gpus_per_node:
        return ""
    return f", in {c.num_nodes} NVLink domain(s) of {c.gpus_per_node}"


def launch_note(s: Scenario) -> str | None:
    """What the launch leaves idle: hosts started with fewer ranks than they hold GPUs, where the GPU
    count does not fill whole hosts (6 GB200: 3 ranks on each of 2 trays); None when they are full."""
    c = s.cluster
    full = min(c.num_gpus, c.system.gpus_per_host)
    if s.procs_per_host == full:
        return None
    return (f"{s.gpus} GPUs do not fill whole {c.system.gpus_per_host}-GPU hosts: the launch starts "
            f"{s.procs_per_host} ranks on each of {s.hosts} hosts (launchers start the same number on every "
            f"host), leaving {c.system.gpus_per_host - s.procs_per_host} GPU(s) of each idle")


def _headline(s: Scenario) -> str:
    p = s.plan
    return (f"{s.model_spec} on {s.gpus} x {s.cluster_spec} ({s.hosts} node(s) x {s.procs_per_host} GPUs{_domains(s)}): "
            f"{p.label()}, schedule {p.schedule}, ZeRO {p.zero}, recompute {p.recompute}, offload {p.offload}"
            f"{' +params' if p.offload_params else ''}, {p.dtype}; seq {s.seq_len}, global batch {s.global_batch}")


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


MTP_NOTE = ("the model trains with multi-token prediction (depth as in the estimate); {engine} builds no MTP "
            "module from this config: add it in the model code, or the run trains without it (and runs faster "
            "than the estimate)")


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
    experts, top-k, expert width, shared experts, which layers, expert parallelism, grouped GEMM and
    the fused permutation the estimate prices, the token dispatcher, capacity (token drop and pad)."""
    e = m.moe
    args: list[tuple[str, ...]] = [("--num-experts", str(e.experts)), ("--moe-router-topk", str(e.top_k)),
                                   ("--moe-ffn-hidden-size", str(e.expert_ffn_hidden))]
    if e.shared_experts:
        args.append(("--moe-shared-expert-intermediate-size", str(e.shared_experts * e.expert_ffn_hidden)))
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
    args: list[tuple[str, ...]] = [("--hybrid-override-pattern", m.layer_pattern)]
    if mb is not None:
        args += [("--mamba-num-heads", str(mb.heads)), ("--mamba-head-dim", str(mb.head_dim)),
                 ("--mamba-state-dim", str(mb.state)), ("--mamba-num-groups", str(mb.groups))]
        if mb.chunk != 128 or mb.conv_kernel != 4:
            notes.append(f"Mamba chunk {mb.chunk} / convolution kernel {mb.conv_kernel}: Megatron-LM's MambaMixer "
                         "fixes 128 and 4 (its constructor defaults), so the run uses those")
    if m.head_dim * m.heads != m.hidden:
        args.append(("--kv-channels", str(m.head_dim)))
    notes.append("hybrid Mamba-2 / attention model: pretrain_mamba.py (needs mamba-ssm and causal-conv1d); "
                 "newer Megatron-LM releases also want --is-hybrid-model")
    return args


#: the schedules that place two chunks on every rank (ZBV, DualPipeV) or run two directions (DualPipe)
TWO_CHUNK_SCHEDULES = ("zbv", "dualpipe", "dualpipev")


def refuse_unrun_schedule(p: Plan, spec: EngineSpec, runs: str) -> None:
    """ConfigError where the engine has no flag for the plan's ZBV, DualPipe or DualPipeV schedule: it would
    run another layout (one chunk per rank, one parameter copy), so the export is refused, not approximated.
    ``runs``: the schedules the engine runs."""
    if p.pp > 1 and p.schedule in TWO_CHUNK_SCHEDULES and p.schedule not in spec.export.schedules:
        raise ConfigError("schedule", f"{spec.title} has no {p.schedule} schedule ({runs}); exporting it would run "
                          "another layout than the estimate's", accepted=f"{runs}; zbv and dualpipev: --to torchtitan"
                          + ("" if p.schedule != "dualpipe" else "; dualpipe: DeepSeek's DualPipe runtime only"))


def build_megatron(s: Scenario, spec: EngineSpec) -> Export:
    """pretrain_gpt.py flags (NVIDIA/Megatron-LM megatron/training/arguments.py) behind torchrun; the
    switches' flags, fp8 recipes and Megatron-FSDP strategies from ``spec.export``."""
    p, m, notes = s.plan, s.model, []
    refuse_unrun_schedule(p, spec, "1f1b, interleaved (zb-h1 and gpipe run as 1F1B)")
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
    if p.sp:
        args.append(("--sequence-parallel",))
    uneven = _megatron_uneven_stages(s)
    args += uneven
    if p.schedule == "interleaved" and not any(a[0] == "--pipeline-model-parallel-layout" for a in uneven):
        args.append(("--num-layers-per-virtual-pipeline-stage",
                     str(max(virtual_stage_layer_counts(m.layers, p)))))
    elif p.schedule == "zb-h1" and p.pp > 1:
        notes.append("schedule zb-h1 (zero-bubble H1, Qi et al. 2023) needs a zero-bubble fork of Megatron-LM "
                     "(sail-sg/zero-bubble-pipeline-parallelism); stock Megatron-LM runs its closest schedule, "
                     "non-interleaved 1F1B, with a larger bubble than the estimate assumed")
    elif p.schedule == "gpipe" and p.pp > 1:
        notes.append("schedule gpipe has no Megatron-LM flag; Megatron-LM runs 1F1B, which has the same "
                     "bubble and keeps at most pp micro-batches of activations in flight")
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
    if p.offload != "none":
        # validate_args requires the precision-aware optimizer for the hybrid CPU/GPU optimizer
        args += [("--optimizer-cpu-offload",), ("--use-precision-aware-optimizer",)]
        if p.offload == "nvme":
            notes.append("NVMe offload has no Megatron-LM flag; --optimizer-cpu-offload keeps the optimizer "
                         "states in host memory instead (check that they fit)")
    if p.offload_params:
        notes.append("parameter offload (ZeRO-Infinity) has no Megatron-LM equivalent; parameters stay on GPU")
    if p.overlap_grad_reduce:
        args.append(("--overlap-grad-reduce",))
        if p.zero >= 1 and p.overlap_param_gather:   # the distributed optimizer's all-gather under the next forward
            args.append(("--overlap-param-gather",))
    args += switch_options(p, spec)     # --tp-comm-overlap, --overlap-moe-expert-parallel-comm, ...
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

    lines = ["#!/usr/bin/env bash",
             "# Megatron-LM launch script written by `paraplan export --to megatron`.",
             f"# Plan: {_headline(s)}",
             "# Run the same script on every node with NODE_RANK unset (c10d rendezvous assigns ranks);",
             "# MASTER_ADDR is the host of the rendezvous (any one node). Extra arguments are passed to",
             f"# {'pretrain_mamba.py' if hybrid else 'pretrain_gpt.py'}, e.g. --data-path ... --tokenizer-type ... to "
             "replace the mock data.",
             *(f"# NOTE: {n}" for n in notes),
             "set -euo pipefail",
             ': "${MEGATRON_LM:=/path/to/Megatron-LM}"',
             ': "${MASTER_ADDR:=localhost}"',
             f': "${{MASTER_PORT:={RDZV_PORT}}}"',
             "",
             "torchrun " + " ".join(_quote(a) for a in _torchrun_args(s)) + " \\",
             f'  "${{MEGATRON_LM}}/{"pretrain_mamba.py" if hybrid else "pretrain_gpt.py"}" \\']
    lines += ["  " + " ".join(_quote(a) for a in group) + " \\" for group in args]
    lines.append('  "$@"')
    return Export(spec.label, "\n".join(lines) + "\n", notes, spec.export.notes_in_text)


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
    refuse_unrun_schedule(p, spec, "1f1b (its PipelineEngine's TrainSchedule)")
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
    if p.grad_accumulation_fusion and not spec.grad_accumulation_fusion:
        notes.append(UNFUSED_ACCUMULATION_NOTE.format(engine=spec.title))
    if s.model.moe is not None:
        e = s.model.moe
        notes.append(f"experts are built in the model code, not by the DeepSpeed config: deepspeed.moe.layer.MoE("
                     f"num_experts={e.experts}, ep_size={s.plan.ep}, k={e.top_k}"
                     + (f", capacity_factor={e.capacity_factor:g}, drop_tokens=True" if e.capacity_factor else
                        ", drop_tokens=False") + f") in each of the {s.model.moe_layers} MoE layers"
                     + (f"; its gate has no group-limited routing, which the estimate prices ({e.router_group_top_k} "
                        f"of {e.router_groups} expert groups a token): re-estimate the model without router_groups"
                        if e.group_limited else ""))
    notes += dropped_switch_notes(p, spec)
    if s.model.mtp_layers:
        notes.append(MTP_NOTE.format(engine=spec.title))
    notes.append(f"launch: deepspeed --num_nodes {s.hosts} --num_gpus {s.procs_per_host} --hostfile HOSTFILE "
                 "train.py, where train.py passes this file to deepspeed.initialize(config=...)")
    return Export(spec.label, json.dumps(cfg, indent=2) + "\n", notes, spec.export.notes_in_text)


def dropped_switch_notes(p, spec: EngineSpec) -> list[str]:
    """Notes for the expert-parallel switches the plan's estimate priced and the engine does not have."""
    return ([EP_OVERLAP_NOTE.format(engine=spec.title)] if p.ep_comm_overlap and not spec.offers("ep_comm_overlap")
            else []) + ([FLEX_DISPATCH_NOTE.format(engine=spec.title)]
                        if p.moe_flex_dispatch and not spec.offers("moe_flex_dispatch") else [])


# --- torchtitan --------------------------------------------------------------------------------------
# paraplan preset -> torchtitan (model name, flavor): torchtitan/models/llama3 and models/deepseek_v3
# (deepseekv3_configs "671B": 61 layers, dim 7168, 256 experts top-8, 1 shared, 3 dense, MLA q_lora 1536)
_TITAN_FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B"),
                  "deepseek-v3": ("deepseek_v3", "671B")}


def _titan_fp8_sections(p, recipes) -> tuple[list[tuple[str, Any]], list[tuple[str, list[tuple[str, Any]]]]]:
    """torchtitan's fp8 switches: the ``[model]`` section's ``converters`` and the converter's own
    section (recipe; float8 all-gather under FSDP with per-tensor scaling). ``recipes``: paraplan fp8
    dtype -> (model converter, its section, recipe_name or None for the default), its spec's."""
    if p.dtype not in recipes:
        return [], []
    converter, section, recipe = recipes[p.dtype]
    items: list[tuple[str, Any]] = [("recipe_name", recipe)] if recipe else []
    if p.dtype == "fp8" and p.zero >= 1:
        items += [("enable_fsdp_float8_all_gather", True), ("precompute_float8_dynamic_scale_for_fsdp", True),
                  ("force_recompute_fp8_weight_in_bwd", True)]   # recommended with FSDP: no unsharded fp8 weights kept
    return [("converters", [converter])], [(section, items)]


#: the SDPA backend that pins each named attention kernel (torch.nn.attention.SDPBackend)
SDPA_BACKEND_OF_KERNEL = {"cudnn": "CUDNN_ATTENTION", "flash2": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def sdpa_kernel_note(p, engine: str) -> list[str]:
    """For engines whose attention goes through torch's scaled_dot_product_attention: how to pin the
    kernel the plan was priced with (torch otherwise picks by version and shape: 2.11 picked cuDNN
    on an H100)."""
    if not p.flash_attention or p.attention_kernel == "auto":
        return []
    if p.attention_kernel == "flash1":
        return [f"the plan was priced with FlashAttention 1.x, which torch's scaled_dot_product_attention does not "
                f"have (its flash backend is FlashAttention-2): {engine} runs it only where the model code calls "
                "the flash-attn 1.x package (flash_attn<2) itself; under SDPA expect attention faster than priced"]
    return [f"the plan was priced with the {p.attention_kernel} attention kernel; {engine} calls "
            f"torch's scaled_dot_product_attention, which picks its own backend: pin it by running the "
            f"step under torch.nn.attention.sdpa_kernel(SDPBackend.{SDPA_BACKEND_OF_KERNEL[p.attention_kernel]})"]


def torchtitan_sdpa_kernel_note(p) -> list[str]:
    """How to pin a named attention kernel under torchtitan, whose ScaledDotProductAttentionWrapper runs
    every call under its own ``sdpa_kernel(sdpa_backends, set_priority=True)`` (cuDNN first;
    torchtitan/models/attention.py), which replaces any backend choice made around the step. Nothing
    for ``auto`` or ``cudnn``, the backend it runs first."""
    if not p.flash_attention or p.attention_kernel in ("auto", "cudnn"):
        return []
    return [f"the plan was priced with the {p.attention_kernel} attention kernel; torchtitan's "
            f"ScaledDotProductAttentionWrapper tries cuDNN first inside every call (a sdpa_kernel context around "
            f"the step does not reach it): set torchtitan.models.attention.ScaledDotProductAttentionWrapper."
            f"sdpa_backends = [SDPBackend.{SDPA_BACKEND_OF_KERNEL[p.attention_kernel]}] before the model is built"]


def build_torchtitan(s: Scenario, spec: EngineSpec) -> Export:
    """A torchtitan TOML job config (sections and keys of torchtitan/config/job_config.py, TOML era).

    Data parallelism maps by ZeRO stage: 0 -> DDP (data_parallel_replicate_degree) when dp is the only
    axis, 1-3 -> FSDP2 (data_parallel_shard_degree). Raises ConfigError for fp16 (torchtitan trains
    in bf16 or fp32 only), for NVMe offload (torchtitan offloads to CPU memory only) and for the flash1
    attention kernel (torch SDPA has no FlashAttention 1.x backend).
    """
    p, m, notes = s.plan, s.model, []
    refuse_unrun_schedule(p, spec, "1f1b, interleaved, gpipe, zbv, dualpipev (torch.distributed.pipelining)")
    fp8_recipes = spec.export.fp8_recipes
    if p.dtype not in ("bf16", *fp8_recipes):
        raise ConfigError("dtype", f"torchtitan has no {p.dtype} mixed precision (training.mixed_precision_param "
                          "accepts bfloat16 or float32; float8 converters: tensorwise, rowwise, mxfp8)",
                          accepted="bf16, " + ", ".join(fp8_recipes))
    if p.offload == "nvme":
        raise ConfigError("offload", "torchtitan offloads to CPU memory only (training.enable_cpu_offload)",
                          accepted="--offload cpu or none")
    if p.flash_attention and p.attention_kernel == "flash1":
        raise ConfigError("attention_kernel", "torchtitan runs attention through torch's scaled_dot_product_attention, "
                          "which has no FlashAttention 1.x backend", accepted="auto, cudnn, flash2, efficient")

    name, flavor = _TITAN_FLAVORS.get(s.model_spec, ("llama3", None))
    if flavor is None:
        flavor = "paraplan-" + "".join(c if c.isalnum() else "-" for c in m.name)
        notes.append(f"torchtitan has no flavor for this model; register {flavor!r} in torchtitan's "
                     f"{name} model args with dim={m.hidden}, n_layers={m.layers}, n_heads={m.heads}, "
                     f"n_kv_heads={m.kv_heads}, vocab_size={m.vocab}, FFN width {m.ffn_hidden}"
                     + (f", multi-head latent attention (q_lora_rank={m.mla.q_lora_rank}, "
                        f"kv_lora_rank={m.mla.kv_lora_rank}, qk_nope_head_dim={m.head_dim}, "
                        f"qk_rope_head_dim={m.mla.qk_rope_head_dim}, v_head_dim={m.mla.v_head_dim}: torchtitan's "
                        "deepseek_v3 model)" if m.mla else f", head_dim={m.head_dim}" if m.q_hidden != m.hidden else "")
                     + (f", MoE: {m.moe.experts} routed experts of width {m.moe.expert_ffn_hidden}, top-{m.moe.top_k}, "
                        f"{m.moe.shared_experts} shared, {m.moe_layers} MoE layers"
                        + (f", num_expert_groups={m.moe.router_groups}, num_limited_groups={m.moe.router_group_top_k}"
                           if m.moe.router_groups is not None else "") + " (torchtitan's MoE args)"
                        if m.moe is not None else ""))
    if (m.activation, m.norm, m.learned_positions) != ("swiglu", "rmsnorm", False):
        notes.append(f"torchtitan's {name} architecture is SwiGLU/RMSNorm/RoPE; this model is "
                     f"{m.activation}/{m.norm}{'/learned positions' if m.learned_positions else ''}, so "
                     "the layout carries over but the model code must be adapted")

    mp = p.tp * p.pp * p.cp
    if p.zero == 0 and mp == 1:
        replicate, shard, reshard = p.dp, 1, None
    else:
        replicate, shard = 1, p.dp
        reshard = "default" if p.zero == 3 else "never"
        if p.zero == 0:
            notes.append("ZeRO-0 with tp/pp/cp: torchtitan's DDP path supports only 1-D data parallelism, so "
                         "data parallelism uses FSDP (parameters sharded, less memory than planned)")
        elif p.zero in (1, 2):
            notes.append(f"ZeRO-{p.zero} maps to FSDP with reshard_after_forward=never (parameters gathered once "
                         "per step, ZeRO-2-like); FSDP also shards the stored parameters")
    if p.tp > 1 and not p.sp:
        notes.append("torchtitan's tensor-parallel plan always applies sequence parallelism to norms/dropout")
    notes += dropped_switch_notes(p, spec)
    if p.ep_comm_overlap and not (p.schedule == "dualpipev" and p.pp > 1):
        # torchtitan overlaps the expert all-to-all in DualPipeV's OVERLAP_F_B actions only
        notes.append(EP_OVERLAP_NOTE.format(engine=spec.title) + " (torchtitan overlaps it under DualPipeV only)")
        p = replace(p, ep_comm_overlap=False)
    if s.model.mtp_layers:
        notes.append(MTP_NOTE.format(engine=spec.title))
    if p.schedule == "zb-h1" and p.pp > 1:
        notes.append("zb-h1 needs one stage per rank; torch.distributed.pipelining's zero-bubble schedules "
                     "(InterleavedZeroBubble, ZBVZeroBubble) need several, so this runs 1F1B")
    if p.offload == "cpu":
        notes.append("training.enable_cpu_offload offloads parameters, gradients and optimizer states (FSDP "
                     "CPU offload), more than optimizer-only offload")
    if p.grad_accumulation_fusion and not spec.grad_accumulation_fusion:
        notes.append(UNFUSED_ACCUMULATION_NOTE.format(engine=spec.title))
    notes += torchtitan_sdpa_kernel_note(p)
    if p.recompute == "selective":
        notes.append("selective recomputation uses torchtitan's per-op policy (selective_ac_option='op'), which "
                     "differs in detail from Megatron's attention-core recomputation")

    v_shape = p.pp > 1 and p.schedule in ("zbv", "dualpipev")
    if v_shape:
        notes.append(f"{spec.export.schedules[p.schedule]} places two stages on every rank in a V (rank r: stages r "
                     f"and {2 * p.pp - 1}-r) and refuses torch.compile'd stages, so compile is off; the estimate "
                     "priced compiled blocks (fused casts and elementwise kernels) and is optimistic by that much")
    if p.ep_comm_overlap and p.schedule == "dualpipev":
        notes.append("pipeline_parallel_expert_parallel_overlap runs torchtitan's overlap_callback for DualPipeV's "
                     "OVERLAP_F_B actions (torchtitan/distributed/dual_pipe_v.py; DeepSeek-V3 models)")
    fp8_model, fp8_sections = _titan_fp8_sections(p, fp8_recipes)
    if p.pp > 1:      # one pipeline step holds all micro-batches of the DP rank: no gradient accumulation
        local_batch = s.global_batch // p.dp
    else:             # no pipeline: local batch is the micro-batch, the rest is gradient accumulation
        local_batch = p.micro_batch
    sections: list[tuple[str, list[tuple[str, Any]]]] = [
        ("job", [("description", f"paraplan export: {s.model_spec} {p.label()}"), ("dump_folder", "./outputs")]),
        ("model", [("name", name), ("flavor", flavor), *fp8_model]),
        ("training", [("local_batch_size", local_batch), ("global_batch_size", s.global_batch),
                      ("seq_len", s.seq_len), ("steps", TRAIN_ITERS), ("mixed_precision_param", "bfloat16"),
                      ("mixed_precision_reduce", "float32")]   # the estimate reduces fp32 gradients
         # the estimate prices compiled blocks (fused casts, gradient sums); async TP needs it. ZBVZeroBubble
         # and DualPipeV refuse compiled stages (_check_torch_compile_compatibility: "not supported with stage
         # modules that have used torch.compile", torch/distributed/pipelining/schedules.py, PyTorch 2.13)
         + [("compile", not v_shape)]
         + ([("enable_cpu_offload", True)] if p.offload == "cpu" else [])),
        ("parallelism", [("data_parallel_replicate_degree", replicate), ("data_parallel_shard_degree", shard)]
         + ([("fsdp_reshard_after_forward", reshard)] if reshard else [])
         + [("tensor_parallel_degree", p.tp)]
         + switch_options(p, spec)       # enable_async_tensor_parallel
         + ([("expert_parallel_degree", p.ep), ("expert_tensor_parallel_degree", p.etp)] if m.moe is not None else [])
         + [("pipeline_parallel_degree", p.pp),
            ("context_parallel_degree", p.cp)]
         + ([("pipeline_parallel_schedule", spec.export.schedules[p.schedule]),
             ("pipeline_parallel_microbatch_size", p.micro_batch),
             _titan_stage_split(m.layers, p)] if p.pp > 1 else [])),
        *fp8_sections,
        ("activation_checkpoint", [("mode", p.recompute)]
         + ([("selective_ac_option", "op")] if p.recompute == "selective" else [])),
    ]
    head = ["# torchtitan job config written by `paraplan export --to torchtitan`.",
            f"# Plan: {_headline(s)}",
            "# Targets the TOML job config of torchtitan/config/job_config.py; launch on every node with",
            f"#   torchrun --nnodes {s.hosts} --nproc-per-node {s.procs_per_host} --rdzv-backend c10d "
            f"--rdzv-endpoint $MASTER_ADDR:{RDZV_PORT} -m torchtitan.train --job.config_file THIS_FILE",
            *(f"# NOTE: {n}" for n in notes)]
    body = []
    for title, items in sections:
        body.append(f"\n[{title}]")
        body += [f"{k} = {_toml_value(v)}" for k, v in items]
    return Export(spec.label, "\n".join(head + body) + "\n", notes, spec.export.notes_in_text)


def _titan_stage_split(layers: int, p: Plan) -> tuple[str, Any]:
    """Layers per (virtual) stage when even; else the split points, the layer each (virtual) stage
    after the first begins with ("layers.N", torchtitan/config/job_config.py
    pipeline_parallel_split_points; pp * vpp stages with interleaving)."""
    v_shape = p.schedule in ("zbv", "dualpipev")
    # ZBV / DualPipeV: two stages per rank that torchtitan places in a V, always as split points (the
    # 2·pp stages explicit, whatever weight its layers-per-stage count gives the embedding and the head)
    counts = virtual_stage_layer_counts(layers, SimpleNamespace(pp=p.pp, vpp=2) if v_shape else p)
    if len(set(counts)) == 1 and not v_shape:
        return ("pipeline_parallel_layers_per_stage", layers // len(counts))
    starts, at = [], 0
    for c in counts[:-1]:
        at += c
        starts.append(f"layers.{at}")
    return ("pipeline_parallel_split_points", starts)


def _toml_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)          # a JSON string is a valid TOML basic string
    raise TypeError(f"no TOML form for {v!r}")


# --- public API ---------------------------------------------------------------------------------------
_BUILDERS: dict[str, Callable[[Scenario, EngineSpec], Export]] = {
    "megatron": build_megatron, "deepspeed": build_deepspeed, "torchtitan": build_torchtitan}
if set(_BUILDERS) != set(ENGINES):
    raise AssertionError("paraplan.planner.export: one builder per engine spec with an export mapping")


def export(doc: Mapping[str, Any], engine: str, source: str = "plan") -> Export:
    """Export a plan document for one engine (ConfigError for unknown engines or inexpressible plans)."""
    build = _BUILDERS.get(engine)
    if build is None:
        close = difflib.get_close_matches(engine, ENGINES, n=1, cutoff=0.6)
        raise ConfigError("--to", f"unknown engine {engine!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
                          accepted=", ".join(ENGINES))
    scenario = load_scenario(doc, source)
    if scenario.plan.dtype == "fp32":
        raise ConfigError("dtype", "fp32 plans (validation on CPU) are not exported", accepted="bf16, fp16")
    scenario, note = as_engine_runs_it(scenario, engine)
    out = build(scenario, spec_named(engine))
    first = [note] + [n for n in (launch_note(scenario),) if n]
    out.notes[:0] = first
    if out.notes_in_text:              # the script and the TOML carry their notes as comments
        lines = out.text.split("\n")
        at = next((i + 1 for i, line in enumerate(lines) if line.startswith("# Plan:")), 1)
        lines[at:at] = ["# NOTE: " + n for n in first]
        out.text = "\n".join(lines)
    return out


def as_engine_runs_it(s: Scenario, engine: str) -> tuple[Scenario, str]:
    """The scenario with the plan as ``engine`` runs it (its model-state layout and buffers; gradient
    accumulation fused only on Megatron-LM), re-estimated, and a note comparing that estimate with
    the plan's own.

    A plan made for another named engine must be runnable and fit as ``engine`` runs it (ConfigError
    otherwise: the rule's message, or what overflows and by how much). A generic plan (no engine
    chosen) that the engine cannot express is exported as before, approximated, with the notes the
    exporter gives and a note that it was not re-estimated; one that does not fit as the engine runs
    it gets a warning note."""
    p = s.plan
    strict = spec_named(p.engine).codebase is not None      # made for a named engine, not the papers' generic one
    try:
        as_run = replace(p, engine=engine,
                         grad_accumulation_fusion=p.grad_accumulation_fusion and spec_named(engine).grad_accumulation_fusion)
    except ConfigError as err:
        if strict:
            raise ConfigError(err.field, f"the plan was made for engine {p.engine}; {engine} cannot run it: "
                              f"{err.problem}", accepted=err.accepted) from None
        return s, (f"not re-estimated for {engine}: {err.problem}; the export approximates the layout (notes "
                   f"below); `paraplan plan --engine {engine}` plans for what {engine} runs")
    after = estimate(s.model, s.job, s.cluster, as_run)
    before = after if as_run == p else estimate(s.model, s.job, s.cluster, p)
    gib = 2**30
    mem_before, mem_after = before.memory_bytes_per_gpu["total"] / gib, after.memory_bytes_per_gpu["total"] / gib
    hbm = s.cluster.accelerator.memory_bytes / gib
    unfused = (" (its own model states and buffers; gradient accumulation unfused, as "
               "--no-grad-accumulation-fusion estimates it)" if p.grad_accumulation_fusion != as_run.grad_accumulation_fusion
               else " (its own model states and buffers)")
    if not after.feasible:
        text = (f"as {engine} runs it{unfused} the plan needs {mem_after:.1f} GiB per GPU of {hbm:.1f} GiB "
                f"(plan file, engine {p.engine}: {mem_before:.1f} GiB): {after.infeasible_reason}; "
                f"re-plan with `paraplan plan --engine {engine}`")
        if strict:
            raise ConfigError("engine", text)
        return replace(s, plan=as_run), "WARNING: " + text
    if as_run == p:
        return s, (f"estimate as {engine} runs it: step {after.step_time_s:.3f} s, {mem_after:.1f} of {hbm:.1f} GiB "
                   f"per GPU (the plan file's)")
    return replace(s, plan=as_run), (
        f"re-estimated as {engine} runs it{unfused}: step {after.step_time_s:.3f} s (plan file, engine {p.engine}: "
        f"{before.step_time_s:.3f} s), {mem_after:.1f} of {hbm:.1f} GiB per GPU (plan file: {mem_before:.1f})")


def to_megatron(doc: Mapping[str, Any]) -> str:
    """A bash script: torchrun + Megatron-LM pretrain_gpt.py with the plan's flags."""
    return export(doc, "megatron").text


def to_deepspeed(doc: Mapping[str, Any]) -> str:
    """A DeepSpeed config JSON (no comments; see :func:`export_notes` for what it leaves to the user)."""
    return export(doc, "deepspeed").text


def to_torchtitan(doc: Mapping[str, Any]) -> str:
    """A torchtitan TOML job config."""
    return export(doc, "torchtitan").text


def export_notes(doc: Mapping[str, Any], engine: str) -> list[str]:
    """What the export approximates or leaves to the user, one sentence each."""
    return export(doc, engine).notes
