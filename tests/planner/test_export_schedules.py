"""Exports of ZBV, DualPipe and DualPipeV: torchtitan writes the V schedules (torch.distributed.pipelining's
ZBVZeroBubble and DualPipeV); Megatron-LM and DeepSpeed, which run neither, and torchtitan for DualPipe
refuse with the reason rather than approximate another layout."""
import tomllib
from pathlib import Path

import pytest
import yaml

from paraplan.errors import ConfigError
from paraplan.planner import export as ex
from paraplan.planner.export import PLAN_SCHEMA

OPTIONS = yaml.safe_load((Path(__file__).resolve().parents[1] / "data" / "engine_options.yaml").read_text())


def doc(schedule, **plan):
    return {"schema": PLAN_SCHEMA,
            "scenario": {"model": "llama3-8b", "cluster": "dgx-h100", "gpus": 16, "seq_len": 4096,
                         "global_batch": 64},
            "plan": {"tp": 1, "pp": 4, "dp": 4, "micro_batch": 1, "zero": 2, "recompute": "full",
                     "schedule": schedule, **plan}, "estimate": {}}


@pytest.mark.parametrize("schedule, name", [("zbv", "ZBVZeroBubble"), ("dualpipev", "DualPipeV")])
def test_torchtitan_writes_the_v_schedules(schedule, name):
    out = ex.export(doc(schedule, engine="torchtitan"), "torchtitan")
    cfg = tomllib.loads(out.text)
    par = cfg["parallelism"]
    assert par["pipeline_parallel_schedule"] == name and par["pipeline_parallel_degree"] == 4
    # 2 * pp = 8 stages of the 32 layers: 7 split points, every 4 layers
    assert par["pipeline_parallel_split_points"] == [f"layers.{4 * i}" for i in range(1, 8)]
    assert cfg["training"]["compile"] is False          # the V schedules refuse compiled stages
    assert any("refuses torch.compile'd stages" in n for n in out.notes)
    keys = {f"{section}.{key}" for section, items in cfg.items() for key in items}
    assert keys <= set(OPTIONS["torchtitan"]["keys"]), keys - set(OPTIONS["torchtitan"]["keys"])
    assert par["pipeline_parallel_schedule"] in OPTIONS["torchtitan"]["choices"]["parallelism.pipeline_parallel_schedule"]


def test_torchtitan_dualpipev_with_the_expert_overlap():
    d = doc("dualpipev", engine="torchtitan", ep=4, ep_comm_overlap=True, recompute="op-sac")
    d["scenario"].update(model="qwen3-30b-a3b", global_batch=64)
    cfg = tomllib.loads(ex.to_torchtitan(d))
    assert cfg["parallelism"]["pipeline_parallel_expert_parallel_overlap"] is True
    assert cfg["parallelism"]["expert_parallel_degree"] == 4
    d["plan"]["ep_comm_overlap"] = False
    assert "pipeline_parallel_expert_parallel_overlap" not in tomllib.loads(ex.to_torchtitan(d))["parallelism"]


@pytest.mark.parametrize("schedule", ["zbv", "dualpipe", "dualpipev"])
@pytest.mark.parametrize("target, runs", [("megatron", "Megatron-LM has no"), ("deepspeed", "DeepSpeed has no")])
def test_engines_without_the_schedule_refuse_the_export(schedule, target, runs):
    with pytest.raises(ConfigError) as err:
        ex.export(doc(schedule, zero=1), target)           # a generic plan: not re-estimated, then refused
    assert err.value.field == "schedule" and f"{runs} {schedule} schedule" in str(err.value)
    assert "zbv and dualpipev: --to torchtitan" in err.value.accepted


def test_torchtitan_refuses_dualpipe():
    with pytest.raises(ConfigError) as err:
        ex.export(doc("dualpipe", zero=1), "torchtitan")
    assert err.value.field == "schedule" and "torchtitan has no dualpipe schedule" in str(err.value)
    assert "DeepSeek's DualPipe runtime only" in err.value.accepted
