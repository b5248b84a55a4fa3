"""Megatron-LM (and NeMo / Megatron-Bridge / Megatron-DeepSpeed, which print the same) training logs.

What is read (Megatron-LM megatron/training/arguments.py ``_print_args`` and training.py
``training_log`` / ``report_memory``):
  * the arguments block ``------------------------ arguments ------------------------`` ...
    ``-------------------- end of arguments ---------------------``: one ``  name ..... value`` line per
    argument; read back into pretrain_gpt.py flags for :func:`paraplan.planner.readers.read_megatron_args`
    (``fp8`` is the dest of ``--fp8-format``, ``gradient_accumulation_fusion False`` is
    ``--no-gradient-accumulation-fusion``, ...), and the model's shape, ``world_size`` (GPUs),
    ``seq_length``, ``global_batch_size``;
  * ``> padded vocab (size: V) with N dummy tokens (new size: P)``: the vocabulary the model trains (P);
  * ``iteration N/ M | ... | elapsed time per iteration (ms): T | throughput per GPU (TFLOP/s/GPU): F |``
    (Megatron-DeepSpeed prints ``TFLOPs: F``): the step time, each line the mean of ``log_interval``
    iterations;
  * ``[Rank R] (after N iterations) memory (MB) | allocated: a | max allocated: m | ...``: the peak
    allocated memory, the largest over the ranks that report (MB = 2**20 bytes: torch's
    ``max_memory_allocated() / 2**20``).
The GPU type is not printed: it comes from ``--gpu``.
"""
from __future__ import annotations

import re

from paraplan.errors import ConfigError
from paraplan.planner.readers import (_MEGATRON_READ, MEGATRON_IGNORED, MEGATRON_MODEL_FLAGS,
                                      read_megatron_args)
from paraplan.planner.runlogs.build import finish, layout_overrides, model_of
from paraplan.planner.runlogs.common import Measured, Overrides, RunLog, median_of, number, steady
from paraplan.workloads.transformer import MoESpec, TransformerModel

KIND = "megatron"
ARGS_START = re.compile(r"-{8,} arguments -{8,}")
ARGS_END = re.compile(r"-{8,} end of arguments -{8,}")
ARG_LINE = re.compile(r"([A-Za-z_]\w*) \.{2,} ?(.*?)\s*$")
ITERATION = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|(.*)")
MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([\d.]+) \| "
                    r"max allocated: ([\d.]+)")
PADDED_VOCAB = re.compile(r"padded vocab \(size: (\d+)\) with (\d+) dummy tokens \(new size: (\d+)\)")
#: printed argument names whose flag is not ``--`` + the name with dashes (the dest of another flag)
DEST_FLAGS = {"fp8": "--fp8-format", "fp4": "--fp4-format"}
#: the dtypes Megatron-LM's validate_args maps its dtype flags to before printing them (``dtype_map`` in
#: megatron/training/arguments.py: fp32, bf16, fp16 and fp8 -> torch.float32, bfloat16, float16, uint8),
#: mapped back to the flag's choices
PRINTED_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.uint8": "fp8"}
#: switches printed as ``name False`` that the flag ``--no-...`` turns off
NEGATED = {"gradient_accumulation_fusion": "--no-gradient-accumulation-fusion",
           "masked_softmax_fusion": "--no-masked-softmax-fusion", "apply_rope_fusion": "--no-rope-fusion"}
#: warm-up: the first logged interval carries the first iterations' set-up (NCCL communicators,
#: allocator growth, kernel autotuning), and the second often still does
DEFAULT_WARMUP = 2


def arguments(text: str) -> dict[str, str] | None:
    """The last printed arguments block as {name: value text}, None when the log has none."""
    starts = list(ARGS_START.finditer(text))
    if not starts:
        return None
    rest = text[starts[-1].end():]
    end = ARGS_END.search(rest)
    if end is None:
        raise ConfigError(f"{KIND} log", "its arguments block has no end line ('end of arguments'): a truncated log")
    out = {}
    for line in rest[:end.start()].splitlines():
        m = ARG_LINE.search(line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def flags_of(args: dict[str, str]) -> list[str]:
    """The printed arguments as the pretrain_gpt.py flags the export reader reads (only those it knows:
    the rest are training data, checkpointing and logging)."""
    known = set(MEGATRON_MODEL_FLAGS) | MEGATRON_IGNORED | set(_MEGATRON_READ)
    argv: list[str] = []
    for name, value in args.items():
        if name in NEGATED:
            if value == "False":
                argv.append(NEGATED[name])
            continue
        flag = DEST_FLAGS.get(name, "--" + name.replace("_", "-"))
        if flag not in known or value in ("None", "False", "[]", ""):
            continue
        if name == "attention_backend":
            value = value.rsplit(".", 1)[-1]            # AttnBackend.flash -> flash
        value = PRINTED_DTYPES.get(value, value)        # torch.bfloat16 -> bf16 (--exp-avg-dtype and the like)
        if name == "num_experts" and value.strip("[]") == "1":
            continue                                    # Megatron-DeepSpeed prints [1] for a dense model
        argv += [flag] if value == "True" else [flag, value.strip("[]")]
    if "virtual_pipeline_model_parallel_size" in args and args["virtual_pipeline_model_parallel_size"] not in ("None", ""):
        if "--num-layers-per-virtual-pipeline-stage" not in argv:
            argv += ["--num-virtual-stages-per-pipeline-rank", args["virtual_pipeline_model_parallel_size"]]
    return argv


def _int(args: dict[str, str], *names: str) -> int | None:
    for n in names:
        v = args.get(n)
        if v not in (None, "None", ""):
            try:
                return int(float(v.strip("[]")))
            except ValueError:
                continue
    return None


def model_from_args(args: dict[str, str], vocab: int | None) -> tuple[TransformerModel | None, dict]:
    """The model the printed arguments describe (None when the vocabulary is unknown: the tokenizer
    sets it and the log printed no padded size), and the shape fields they state."""
    layers, hidden, heads = _int(args, "num_layers", "encoder_num_layers"), _int(args, "hidden_size"), _int(args, "num_attention_heads")
    gqa = args.get("group_query_attention") == "True"
    kv = _int(args, "num_query_groups") if gqa else _int(args, "num_key_value_heads")
    ffn = _int(args, "ffn_hidden_size")
    vocab = vocab or _int(args, "padded_vocab_size", "vocab_size")
    shape = {k: v for k, v in (("layers", layers), ("hidden", hidden), ("heads", heads), ("kv_heads", kv),
                               ("ffn_hidden", ffn), ("vocab", vocab)) if v is not None}
    if None in (layers, hidden, heads, vocab):
        return None, shape
    swiglu = args.get("swiglu") == "True"
    rotary = args.get("position_embedding_type") == "rope" or args.get("use_rotary_position_embeddings") == "True"
    experts = _int(args, "num_experts")
    moe = None
    if experts and experts > 1:
        moe = MoESpec(experts=experts, top_k=_int(args, "moe_router_topk") or 2,
                      expert_ffn_hidden=_int(args, "moe_ffn_hidden_size") or ffn or 4 * hidden,
                      latent_size=_int(args, "moe_latent_size") or 0)     # LatentMoE (None: none)
    dropout = float(args.get("hidden_dropout", "0.1") or 0.1) > 0
    model = TransformerModel(
        name=f"megatron-log-{layers}L-{hidden}h", layers=layers, hidden=hidden, heads=heads, vocab=vocab,
        kv_heads=kv if kv and kv != heads else None, ffn_hidden=ffn, activation="swiglu" if swiglu else "gelu",
        tied_embeddings=args.get("untie_embeddings_and_output_weights") != "True",
        norm="rmsnorm" if args.get("normalization", "").lower() == "rmsnorm" else "layernorm",
        bias=args.get("add_bias_linear", "True") == "True", rotary=rotary,
        learned_positions=not rotary and args.get("add_position_embedding", "True") == "True",
        max_positions=_int(args, "max_position_embeddings") or 0, moe=moe, dropout=dropout)
    return model, shape


def iterations(text: str) -> list[tuple[int, dict[str, float]]]:
    """(iteration, {field: value}) of each logged iteration line, in log order."""
    out = []
    for m in ITERATION.finditer(text):
        fields = {}
        for part in m.group(2).split("|"):
            if ":" in part:
                k, _, v = part.rpartition(":")
                try:
                    fields[k.strip()] = number(v.strip())
                except ValueError:
                    continue
        if "elapsed time per iteration (ms)" in fields:
            out.append((int(m.group(1)), fields))
    return out


def read(text: str, source: str, overrides: Overrides) -> RunLog:
    """A Megatron-LM log -> RunLog (module docstring). ConfigError names what is missing."""
    args = arguments(text)
    lines = iterations(text)
    if args is None:
        raise ConfigError(f"{KIND} log", "has no arguments block ('------------------------ arguments "
                          "------------------------', printed at start-up on rank 0): its configuration is not in "
                          f"the log; keep the start of the log{' (it has ' + str(len(lines)) + ' iteration lines)' if lines else ''}")
    warmup = DEFAULT_WARMUP if overrides.warmup is None else overrides.warmup
    step_ms, kept, skipped = steady(KIND, [(i, f["elapsed time per iteration (ms)"]) for i, f in lines], warmup,
                                    "'iteration ... elapsed time per iteration (ms)'")
    steady_fields = [f for i, f in lines if i in kept]
    tflops = median_of([f.get("throughput per GPU (TFLOP/s/GPU)", f.get("TFLOPs")) for f in steady_fields])
    mem = [float(m.group(4)) for m in MEMORY.finditer(text)]
    padded = PADDED_VOCAB.findall(text)
    notes = []
    if args.get("deepspeed") == "True":
        notes.append("Megatron-DeepSpeed (its arguments say deepspeed True): read as Megatron-LM's layout; its "
                     f"ZeRO stage {args.get('zero_stage', '0')} is DeepSpeed's")
    read_cfg = read_megatron_args(flags_of(args))
    logged, shape = model_from_args(args, int(padded[-1][2]) if padded else None)
    model, model_notes = model_of(KIND, logged, shape, overrides, "the log prints no vocabulary (no 'padded vocab' line "
                                  "and vocab_size None: the tokenizer sets it)")
    plan = read_cfg.plan
    if plan is not None:
        fields = layout_overrides(KIND, {k: getattr(plan, k) for k in plan.__dataclass_fields__}, overrides)
        if args.get("deepspeed") == "True" and _int(args, "zero_stage"):
            fields["zero"] = _int(args, "zero_stage")
        plan = type(plan)(**fields)
    gpus = _int(args, "world_size")
    gbs = _int(args, "global_batch_size")
    tokens = (gbs * read_cfg.seq_len / (step_ms / 1000) / gpus) if gbs and read_cfg.seq_len and gpus else None
    measured = Measured(step_time_s=step_ms / 1000, steps=kept, skipped=skipped, tokens_per_s_per_gpu=tokens,
                        tflops_per_gpu=tflops, peak_memory_gib=max(mem) / 1024 if mem else None,
                        memory_kind="max allocated, largest rank" if mem else "")
    return finish(KIND, source, read_cfg, plan, model, read_cfg.seq_len, gbs, None, gpus, measured, overrides,
                  notes + model_notes)
