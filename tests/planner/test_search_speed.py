"""The search's shortcuts give what the plain computation gives: the crossed rules applied once per distinct
projection (``compose_candidates``) against the flat product they replace, and the time terms priced only
for candidates that fit (``score_fitting``) against pricing every candidate."""
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from paraplan.costmodels.efficiency import curves_for
from paraplan.engines import SPECS
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import PLAN_FIELD_SPECS, PlanBatch, Scene
from paraplan.planner import space as S
from paraplan.planner.search import score_batch, score_fitting, search
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob


def compose_flat(model, job, cluster, options=None):
    """The space as composed before the crossed rules were grouped: every crossed candidate built, every
    rule applied to each (paraplan 0d7fd21's ``compose``), as the reference."""
    options = options or S.SpaceOptions()
    fixed = S.normalize_fix(options.fixed)
    ch = S.axis_choices(model, job, cluster, options)
    dtype, engine = ch.pop("_dtype"), ch.pop("_engine")
    gpus = cluster.num_gpus
    scene = Scene(model, job, cluster, fixed.get("dp") or None)
    a, b = S._grid(ch, S.FIRST_AXES), S._grid(ch, S.SECOND_AXES)
    n1, n2 = a["tp"].size, b["sp"].size
    rejected = Counter()
    mp = a["tp"] * a["pp"] * a["cp"]
    first = S._first_view(a, np.where(gpus % mp == 0, gpus // np.maximum(mp, 1), 0), dtype, engine, fixed)
    keep1 = S._apply(S._stage_rules(1), first, scene, np.ones(n1, bool), rejected, n2)
    second = S._second_view(b, dtype, engine)
    keep2 = S._apply(S._stage_rules(2), second, scene, np.ones(n2, bool), rejected, int(keep1.sum()))
    f = {k: v[keep1] for k, v in vars(first).items() if k not in ("dtype", "engine_code")}
    s = {k: v[keep2] for k, v in vars(second).items() if k not in ("dtype", "engine_code")}
    nf, ns = f["tp"].size, s["sp"].size
    both = {k: np.repeat(v, ns) for k, v in f.items()}
    both.update({k: np.tile(v, nf) for k, v in s.items()})
    both["etp"] = np.where(both["etp_is_tp"], both["tp"], 1)
    both.update({k: np.full(nf * ns, v) for k, v in
                 S.batch_wide_columns(fixed, options, engine, cluster.accelerator.flash_attention).items()})
    both = SimpleNamespace(**both, dtype=dtype, engine_code=engine)
    for column in S.OPT_IN_FLAG_RULES:
        setattr(both, column, S._opt_in_flag_where_it_runs(both, scene, column, bool(fixed.get(column, False))))
    both.recompute_modules_mask = S._recompute_modules_where_they_run(both, scene, fixed.get("recompute_modules", ""))
    extra = 0
    if "recompute_modules" not in fixed and SPECS[int(engine)].offers("recompute_modules"):
        both, extra = S._with_recompute_module_sets(both, S.searched_recompute_module_sets(model))
    keep3 = S._apply(S._stage_rules(3), both, scene, np.ones(both.tp.size, bool), rejected, 1)
    idx = np.nonzero(keep3)[0]
    # then each legal candidate an engine switch can run on again, every such switch on (the flat reference of
    # compose's switch variants)
    varied, on = S._switch_variants(both, scene, keep3, S.searched_switches(fixed, options, engine, dtype))
    columns = {k: np.concatenate([v[idx], on[k] if k in on else v[varied]]) for k, v in vars(both).items()
               if k not in ("dtype", "engine_code", "etp_is_tp")}
    n = idx.size + varied.size
    return PlanBatch(**columns, engine_code=np.full(n, int(both.engine_code)), dtype=both.dtype), \
        rejected, n1 * n2 + extra + varied.size


CASES = [
    ("llama3-70b", "dgx-h100", 64, 8192, 512, {}),
    ("llama3-70b", "dgx-h100", 64, 8192, 512, {"fixed": {"engine": "torchtitan"}}),
    ("llama3-70b", "dgx-h100", 64, 8192, 512, {"fixed": {"engine": "deepspeed"}}),
    ("llama3-70b", "dgx-h100", 64, 8192, 512, {"fixed": {"engine": "scaling"}}),
    ("llama3-8b", "dgx-h100", 8, 4096, 64, {"fixed": {"tp": 2, "etp": 2}}),
    ("llama3-8b", "dgx-h100", 16, 4096, 64, {"fixed": {"first_stage_layers": 3}}),
    ("llama3-8b", "dgx-h100", 16, 4096, 64, {"fixed": {"dp": 4}}),
    ("gpt-3.6b", "a100-eth40", 32, 2048, 256, {"allow_compression": True, "allow_delayed_update": True}),
    ("gpt-1t", "dgx-a100-80g", 8, 2048, 8, {"allow_offload": False}),
    ("qwen3-30b-a3b", "dgx-h100", 16, 4096, 64, {"fixed": {"engine": "megatron", "recompute_modules": "layernorm,moe_act"}}),
    ("qwen3-30b-a3b", "dgx-h100", 16, 4096, 64, {"fixed": {"engine": "megatron", "offload_activation_layers": 2}}),
    ("mixtral-8x7b", "dgx-h100", 16, 4096, 64, {"fixed": {"engine": "megatron", "ep_comm_overlap": True,
                                                          "moe_flex_dispatch": True}}),
    ("deepseek-v3", "dgx-h100", 32, 4096, 128, {"fixed": {"engine": "megatron"}}),     # two module lists searched
    ("llama3-8b", "dgx-h100", 16, 4096, 64, {"fixed": {"dtype": "fp8"}}),        # all three engine switches searched
    ("llama3-8b", "dgx-h100", 16, 4096, 64, {"fixed": {"tp_comm_overlap": True, "grad_reduce_bf16": False}}),
    ("llama3-8b", "dgx-h100", 16, 4096, 64, {"engine_switches": False}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[5]}")
def test_grouped_crossed_rules_compose_the_flat_product(case):
    """Same candidates, in the same order (the ranking's last tie-break), with the same columns and dtypes,
    the same rejections by reason and the same composed count."""
    name, system, gpus, seq, batch, options = case
    model, cluster, job = load_model(name), load_cluster(system, gpus), TrainingJob(seq, batch)
    want, want_rejected, want_composed = compose_flat(model, job, cluster, S.SpaceOptions(**options))
    got, rejected, composed = S.compose(model, job, cluster, S.SpaceOptions(**options))
    assert (len(got), composed, rejected) == (len(want), want_composed, want_rejected)
    for spec in PLAN_FIELD_SPECS.values():
        a, b = np.asarray(getattr(want, spec.column)), np.asarray(getattr(got, spec.column))
        assert a.dtype == b.dtype and np.array_equal(a, b), spec.column
    assert len(got) > 0


def test_candidates_build_any_slice_or_index_like_the_whole_batch():
    model, cluster, job = load_model("mixtral-8x7b"), load_cluster("dgx-h100", 16), TrainingJob(4096, 64)
    cands, _, _ = S.compose_candidates(model, job, cluster, S.SpaceOptions(fixed={"engine": "megatron"}))
    whole = cands.take(slice(None))
    rows = np.random.default_rng(0).integers(0, len(cands), 50)
    for index in (slice(100, 250), rows):
        part, ref = cands.take(index), whole.take(index)
        assert all(np.array_equal(getattr(part, s.column), getattr(ref, s.column)) for s in PLAN_FIELD_SPECS.values()
                   if not s.per_batch)
    assert cands.plan(int(rows[3])) == whole.plan(int(rows[3]))


@pytest.mark.parametrize("name,system,gpus,seq,batch,fraction", [
    ("llama3-70b", "dgx-h100", 64, 8192, 512, 0.95),
    ("mixtral-8x7b", "dgx-h100", 16, 4096, 64, 1.0),
])
def test_pricing_only_what_fits_changes_no_number(name, system, gpus, seq, batch, fraction):
    """Memory first, time terms for the candidates that fit: the same memory and limits everywhere and, where
    a candidate fits, the same step time to the bit (numpy is elementwise), so the same ranking."""
    model, cluster, job = load_model(name), load_cluster(system, gpus), TrainingJob(seq, batch)
    plans, _, _ = S.compose(model, job, cluster)
    curves = curves_for(cluster)
    every = score_batch(model, job, cluster, plans, curves, fraction)
    fitting = score_fitting(model, job, cluster, plans, curves, fraction)
    for a, b in zip(every[1:], fitting[1:]):
        assert np.array_equal(a, b)
    fits = ~(every[2] | every[3] | every[4])
    assert 0 < fits.sum() < len(plans)
    assert np.array_equal(every[0][fits], fitting[0][fits]) and np.isinf(fitting[0][~fits]).all()


def test_nothing_fits_still_names_the_closest_candidate():
    """With nothing that fits the closest candidate is the least overflow, then the fastest, then the first
    composed, as when every candidate was priced (GPT 1T on 8 A100 without offload)."""
    model, cluster, job = load_model("gpt-1t"), load_cluster("dgx-a100-80g", 8), TrainingJob(2048, 8)
    options = S.SpaceOptions(allow_offload=False)
    result = search(model, job, cluster, options=options, top=3)
    assert not result.plans
    plans, _, _ = S.compose(model, job, cluster, options)
    step, mem, *_ = score_batch(model, job, cluster, plans, curves_for(cluster), 1.0)
    ratio = mem / cluster.accelerator.memory_bytes
    want = plans.plan(int(np.lexsort((np.arange(len(plans)), step, ratio))[0]))
    assert result.closest_infeasible.plan == want.with_dp_for(cluster.num_gpus)
