"""A trained router loads the busiest expert-parallel rank above the mean (moe.routed_time_factor, FEPLB's
measurement), so a dropless MoE layer's experts and all-to-alls wait for it; a router forced to balance
(Megatron-Bridge's performance runs, the calibration rows) and a single GPU holding every expert do not."""
from dataclasses import replace

import numpy as np
import pytest

from paraplan.calibration import load_h100_cases
from paraplan.costmodels.estimate import estimate
from paraplan.costmodels.moe import ROUTED_RANK_IMBALANCE, expert_token_factor, routed_time_factor
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.scenario import load_scenario
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

DSV3 = load_model("deepseek-v3")
CLUSTER = load_cluster("dgx-h100", 1024)
PLAN = Plan(tp=2, pp=8, vpp=4, schedule="interleaved", dp=64, ep=64, sp=True, micro_batch=1, engine="megatron",
            dtype="fp8")


def _step(job, plan=PLAN):
    return estimate(DSV3, job, CLUSTER, plan)


def test_a_trained_router_is_the_default_and_costs_time_under_expert_parallelism():
    learned, balanced = TrainingJob(4096, 8192), TrainingJob(4096, 8192, moe_imbalance=1.0)
    assert learned.moe_imbalance is None
    a, b = _step(learned), _step(balanced)
    assert ROUTED_RANK_IMBALANCE == pytest.approx(1 / (1 - 0.186), abs=0.005)
    # the routed experts' GEMMs and the all-to-alls wait for the busiest rank: slower, by less than the factor
    assert 1.03 < a.step_time_s / b.step_time_s < ROUTED_RANK_IMBALANCE
    for term in ("compute", "ep_comm"):
        assert a.time_breakdown_s[term] > b.time_breakdown_s[term]
    # what a rank holds, summed over its layers, is the mean's: memory does not move
    assert a.memory_bytes_per_gpu == b.memory_bytes_per_gpu


def test_stated_imbalance_and_no_expert_parallelism_keep_their_meaning():
    assert routed_time_factor(TrainingJob(4096, 8, moe_imbalance=1.5), PLAN) == 1.5
    assert float(routed_time_factor(TrainingJob(4096, 8), Plan(ep=1))) == 1.0
    assert float(routed_time_factor(TrainingJob(4096, 8), PLAN)) == ROUTED_RANK_IMBALANCE
    assert expert_token_factor(DSV3, TrainingJob(4096, 8)) == 1.0            # memory: the mean
    capped = replace(DSV3, moe=replace(DSV3.moe, capacity_factor=1.25))
    assert expert_token_factor(capped, TrainingJob(4096, 8), PLAN) == 1.25  # padded to capacity
    one_gpu = Plan(dp=8, ep=1, micro_batch=1, engine="megatron")
    mixtral, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100", 8)
    assert (estimate(mixtral, TrainingJob(4096, 64), cluster, one_gpu).step_time_s
            == estimate(mixtral, TrainingJob(4096, 64, moe_imbalance=1.0), cluster, one_gpu).step_time_s)


@pytest.mark.parametrize("bad", [0.5, True, "2"])
def test_a_bad_imbalance_is_refused(bad):
    with pytest.raises(ConfigError, match="moe-imbalance"):
        TrainingJob(4096, 8, moe_imbalance=bad)


def test_the_cli_default_is_the_trained_router():
    assert load_scenario("deepseek-v3", "dgx-h100", gpus=1024).job(PLAN).moe_imbalance is None


def test_megatron_bridge_moe_rows_are_read_with_the_forced_balance():
    cases, _ = load_h100_cases()
    moe = [c for c in cases if c.model.moe is not None]
    assert moe and all(c.job.moe_imbalance == 1.0 for c in moe)
    dropless = [c for c in moe if not c.model.moe.capacity_factor]
    assert dropless and all(any("force the router to balance" in a for a in c.assumed) for c in dropless)
    dense = [c for c in cases if c.model.moe is None]
    assert all(c.job.moe_imbalance is None for c in dense)
    assert np.all([c.job.moe_imbalance != 1.0 for c in dense])


def _estimate_json(capsys, *extra):
    from paraplan.cli import main
    assert main(["estimate", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "1024", "--seq-len", "4096",
                 "--global-batch", "8192", "--tp", "2", "--pp", "8", "--ep", "64", "--format", "json", *extra]) == 0
    import json
    return json.loads(capsys.readouterr().out)


def test_the_estimate_says_the_imbalance_it_priced_and_how_to_turn_it_off(capsys):
    default, forced = _estimate_json(capsys), _estimate_json(capsys, "--moe-imbalance", "1")
    said = [a for a in default["assumptions"] if "trained router" in a]
    assert said and "1.23x" in said[0] and "--moe-imbalance 1" in said[0]
    assert not any("busiest" in a for a in forced["assumptions"])
    assert default["step_time_s"] > 1.03 * forced["step_time_s"]


def test_a_bad_imbalance_on_the_command_line_is_refused_by_name(capsys):
    from paraplan.cli import main
    assert main(["estimate", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "1024", "--ep", "64",
                 "--moe-imbalance", "0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("paraplan estimate: error: --moe-imbalance") and ">= 1" in err[0]
