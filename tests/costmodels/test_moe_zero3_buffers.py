"""ZeRO-3 / FSDP hold a whole layer while it is gathered (the current and the prefetched one): for an MoE
model that is an MoE layer with all its local experts, not a dense layer (memory.gathered_layer_params)."""
import pytest

from paraplan.costmodels import memory as M
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

QWEN = load_model("qwen3-235b-a22b")      # 94 MoE layers, 128 experts of 3 x 4096 x 1536
JOB = TrainingJob(4096, 2048)
H100_256 = load_cluster("dgx-h100", 256)


def test_an_moe_layer_gathers_its_local_experts():
    e = QWEN.moe
    experts = e.experts * QWEN.expert_mlp_params
    whole = M.gathered_layer_params(QWEN, Plan(dp=256, zero=3))
    assert whole == pytest.approx(QWEN.params_per_moe_layer)            # ep 1: every expert of the layer
    assert whole > 10 * QWEN.params_per_layer                          # the dense-layer figure used before
    eight = M.gathered_layer_params(QWEN, Plan(dp=256, ep=8, zero=3))
    assert eight == pytest.approx(QWEN.params_per_moe_layer - experts + experts / 8)
    dense = load_model("llama3-8b")
    assert M.gathered_layer_params(dense, Plan(tp=2, dp=4, zero=3)) == dense.params_per_layer / 2


def test_zero3_without_expert_parallelism_pays_for_the_gathered_experts():
    """Qwen3-235B-A22B on 256 H100, ZeRO-3, no expert parallelism: two gathered MoE layers of 2.4 B
    parameters in 16 bits are ~9 GiB of buffers (the dense-layer figure gave 0.8 GiB and let the planner
    pick this layout at 78.5 of 80 GiB); with ep 8 the buffers shrink with the local experts."""
    plan = Plan(dp=256, zero=3, recompute="full", micro_batch=8, dtype="fp8")
    buffers = estimate(QWEN, JOB, H100_256, plan).memory_bytes_per_gpu["buffers"] / 2**30
    ep8 = estimate(QWEN, JOB, H100_256, Plan(dp=256, ep=8, zero=3, recompute="full", micro_batch=8,
                                              dtype="fp8")).memory_bytes_per_gpu["buffers"] / 2**30
    runtime = 1.5        # the runtime reserve the buffers include (the estimate's assumption line)
    assert buffers > 8 and ep8 - runtime < (buffers - runtime) / 4
