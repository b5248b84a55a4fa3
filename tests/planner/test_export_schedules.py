"""Exports of ZBV, DualPipe and DualPipeV: torchtitan writes the V schedules (torch.distributed.pipelining's
ZBVZeroBubble and DualPipeV); Megatron-LM and DeepSpeed, which run neither, and torchtitan for DualPipe
export the nearest plan they run (1F1B), re-estimated beside the plan's."""
import tomllib
from pathlib import Path

import pytest
import yaml

from paraplan.planner import export as ex
from paraplan.planfile import PLAN_SCHEMA

OPTIONS = yaml.safe_load((Path(__file__).resolve().parents[1] / "data" / "engine_options.yaml").read_text())


def doc(schedule, **plan):
    return {"schema": PLAN_SCHEMA,
            "scenario": {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 16, "seq_len": 4096,
                         "global_batch": 64},
            "plan": {"tp": 1, "pp": 4, "dp": 4, "micro_batch": 1, "zero": 2, "recompute": "full",
                     "schedule": schedule, **plan}, "estimate": {}}


@pytest.mark.parametrize("schedule, name", [("zbv", "ZBVZeroBubble"), ("dualpipev", "DualPipeV")])
def test_torchtitan_writes_the_v_schedules(schedule, name):
    """Both formats write the schedule, its 2·pp V-placed chunks and compile off (torch refuses compiled
    stages there); the re-estimate prices the eager elementwise kernels that follows from it."""
    out = ex.export(doc(schedule, engine="torchtitan", grad_accumulation_fusion=False), "torchtitan",
                    torchtitan_format="toml")
    cfg = tomllib.loads(out.text)
    par = cfg["parallelism"]
    assert par["pipeline_parallel_schedule"] == name and par["pipeline_parallel_degree"] == 4
    chunks = par["module_fqns_per_model_part"]          # 2 * pp = 8 chunks of the 32 layers, 4 layers each
    assert len(chunks) == 8 and [sum(m.startswith("layers.") for m in c) for c in chunks] == [4] * 8
    assert cfg["compile"]["enable"] is False
    assert any("refuses torch.compile'd stages" in n for n in out.notes)
    assert f"eager elementwise ops ({schedule} refuses compiled stages)" in out.notes[0]
    keys = {f"{section}.{key}" for section, items in cfg.items() for key in items}
    assert keys <= set(OPTIONS["torchtitan"]["keys"]), keys - set(OPTIONS["torchtitan"]["keys"])
    assert name in OPTIONS["torchtitan"]["choices"]["parallelism.pipeline_parallel_schedule"]
    python = ex.export(doc(schedule, engine="torchtitan", grad_accumulation_fusion=False), "torchtitan")
    assert f"'pipeline_parallel_schedule': '{name}'" in python.text and "'enable': False" in python.text


def test_torchtitan_dualpipev_expert_overlap_is_exported_off_and_re_estimated():
    """torchtitan 0.3.0 has no option for DualPipeV's expert all-to-all overlap: the export is the nearest
    plan without it, and its estimate says so (it was written as an option 0.3.0 does not read)."""
    d = doc("dualpipev", engine="torchtitan", ep=4, ep_comm_overlap=True, recompute="op-sac",
            grad_accumulation_fusion=False)
    d["scenario"].update(model="qwen3-30b-a3b", global_batch=64)
    out = ex.export(d, "torchtitan", torchtitan_format="toml")
    cfg = tomllib.loads(out.text)
    assert "pipeline_parallel_expert_parallel_overlap" not in cfg["parallelism"]
    assert cfg["parallelism"]["expert_parallel_degree"] == 4
    assert "no EP overlap (no option in torchtitan 0.3.0)" in out.notes[0]


@pytest.mark.parametrize("schedule", ["zbv", "dualpipe", "dualpipev"])
@pytest.mark.parametrize("target", ["megatron", "deepspeed"])
def test_engines_without_the_schedule_export_the_nearest_plan(schedule, target):
    """Megatron-LM and DeepSpeed run none of the three: the export is the nearest plan they run (1F1B),
    re-estimated beside the plan's own estimate."""
    out = ex.export(doc(schedule, zero=1), target)
    assert f"1F1B for {schedule}" in out.notes[0] and "planned (engine generic)" in out.notes[0]
    if target == "megatron":
        assert "--num-layers-per-virtual-pipeline-stage" not in out.text


def test_torchtitan_runs_dualpipe_as_its_nearest_plan():
    out = ex.export(doc("dualpipe", zero=2), "torchtitan", torchtitan_format="toml")     # a generic plan
    assert tomllib.loads(out.text)["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    assert "1F1B for dualpipe" in out.notes[0]
