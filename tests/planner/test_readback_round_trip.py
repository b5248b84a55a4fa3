"""Exports read back into the plan they were written for (benchmarks/engine_configs/corpus.py over the
whole corpus; these are the cases the corpus found broken when the V schedules, overlap_param_gather, NVFP4
and hybrid models joined it): each read-back estimate equals the exported plan's."""
import pytest

from paraplan.planfile import PLAN_SCHEMA
from paraplan.planner.readback import read_back


def doc(model, cluster, **plan):
    return {"schema": PLAN_SCHEMA, "estimate": {},
            "scenario": {"model": model, "cluster": cluster, "gpus": 16, "seq_len": 4096, "global_batch": 64},
            "plan": plan}


@pytest.mark.parametrize("engine, fmt, d", [
    # --overlap-param-gather absent beside --overlap-grad-reduce: read as no overlap (was read as the default)
    ("megatron", "python", doc("llama3-8b", "dgx-h100", zero=1, overlap_param_gather=False, engine="megatron")),
    # ZBV / DualPipeV: 2·pp module lists are one stage a rank (was read as vpp 2 and refused), compile off read
    # as eager elementwise kernels
    ("torchtitan", "python", doc("llama3-8b", "dgx-h100", pp=4, schedule="zbv", zero=2, engine="torchtitan",
                                 grad_accumulation_fusion=False)),
    ("torchtitan", "toml", doc("llama3-8b", "dgx-h100", pp=4, schedule="dualpipev", zero=2, engine="torchtitan",
                               grad_accumulation_fusion=False)),
    # NVFP4 flags (--fp4-format / --fp4-recipe / --fp4-param-gather) read as nvfp4 (were read as bf16)
    ("megatron", "python", doc("llama3-8b", "dgx-b200", zero=1, dtype="nvfp4", fp8_param_gather=True,
                               engine="megatron")),
    # a hybrid model's script runs pretrain_mamba.py (was "no line runs pretrain_gpt.py")
    ("megatron", "python", doc("nemotron-h-8b", "dgx-h100", tp=2, sp=True, zero=1, engine="megatron")),
])
def test_the_export_reads_back_to_the_same_estimate(engine, fmt, d):
    r = read_back(d, engine, torchtitan_format=fmt)
    assert r.same, r
