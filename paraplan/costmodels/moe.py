"""An MoE layer's own costs for one micro-batch on one GPU: the router and the routed and shared experts'
GEMMs (and the routed experts' weight-gradient accumulation), GShard-style einsum dispatch, Megatron-Core's
eager expert biases, the token permutation's traffic, the expert-parallel all-to-alls (DeepEP / HybridEP's
flex dispatch by a token's expected distinct destinations), the rows its MLP moves through tensor-parallel
collectives, the host-bound floor of a dropless Megatron-Core layer, and the all-to-alls' overlap under
combined 1F1B; and the lines an estimate says about them (``*_assumption``).
"""
from __future__ import annotations

import math

import numpy as np

from paraplan.constants import fitted
from paraplan.costmodels.comm import ALL_TO_ALL, collective_time, ranks_per_node
from paraplan.costmodels.kernels import (BYTES, GEMM_OPERAND_BYTES, _dtype, _linear_dtype, element_bytes,
                                         megatron_grad_bytes, micro_batches, mlp_gemm_forward_time,
                                         routed_experts_gemm_time, tokens_per_rank)
from paraplan.costmodels.tpcomm import TP_OVERLAP_CONTENTION
from paraplan.engines import engine_flag, spec_of
from paraplan.plan import Schedule, expert_group_strides


# The busiest expert-parallel rank's routed tokens over the mean under a trained router (dropless, ep > 1):
# read from a published measurement (fitted_constants.yaml, moe_routed_rank_imbalance).
ROUTED_RANK_IMBALANCE = fitted("moe_routed_rank_imbalance")


def expert_token_factor(model, job, plan=None):
    """Routed token copies per routed copy of a balanced share that an MoE layer handles: the capacity
    factor when tokens are padded to capacity, else the routing imbalance.

    Without ``plan`` (memory: what a rank holds, summed over its layers, where the busiest rank of one
    layer is not the busiest of the next) the job's stated ``moe_imbalance``, 1 when it states none.
    With ``plan`` (time: each layer's grouped GEMMs, permutation and all-to-alls wait for its busiest
    rank) :func:`routed_time_factor`."""
    cf = model.moe.capacity_factor
    if cf:
        return cf
    if plan is None:
        return 1.0 if job.moe_imbalance is None else job.moe_imbalance
    return routed_time_factor(job, plan)


def routed_time_factor(job, plan):
    """The busiest expert-parallel rank's routed tokens over the mean, which a dropless MoE layer's
    routed experts and all-to-alls wait for: the job's ``moe_imbalance`` where it states one (1.0 for a
    run whose router was forced to balance, e.g. Megatron-Core's moe_router_force_load_balancing);
    otherwise, for a trained router, ROUTED_RANK_IMBALANCE = 1.23 where ep > 1 (FEPLB, Qi et al. 2026,
    arXiv:2604.19654: 18.6 % of an MoE layer's GPU time idle behind the busiest of 8 EP ranks,
    1 / (1 - 0.186)) and 1 without expert parallelism (one GPU's grouped GEMM runs all of its tokens
    whichever expert they chose)."""
    if job.moe_imbalance is not None:
        return job.moe_imbalance
    ep = np.asarray(getattr(plan, "ep", 1), dtype=float)
    return np.where(ep > 1, ROUTED_RANK_IMBALANCE, 1.0)


def routed_expert_gemms(model, job, plan):
    """The routed experts' two GEMMs on one GPU, as :func:`moe_mlp_forward_time` prices them:
    (m tokens per expert, experts held, grouped, [(n, k) of the up (gate) and down projections])."""
    e = model.moe
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    ep = np.asarray(plan.ep, dtype=float)
    etp = np.asarray(plan.etp, dtype=float)
    h, g, fe = model.moe_width, model.mlp_matrices - 1, e.expert_ffn_hidden     # LatentMoE: ℓ wide
    m = T * e.top_k * expert_token_factor(model, job, plan) * ep / e.experts * etp / t
    return m, e.experts / ep, e.dispatch == "permute", [(g * fe / etp, h), (h, fe / etp)]


def routed_experts_forward_times(model, job, plan, curves) -> tuple:
    """Forward seconds of each of the routed experts' two GEMMs on one GPU (the shapes of
    :func:`routed_expert_gemms`, priced by :func:`routed_experts_gemm_time`)."""
    m, local, grouped, shapes = routed_expert_gemms(model, job, plan)
    return tuple(routed_experts_gemm_time(curves, m, n, k, local, plan, grouped) for n, k in shapes)


def moe_mlp_forward_time(model, job, plan, curves, routed=None):
    """Forward time of an MoE layer's MLP on one GPU: router, routed experts and shared experts.

    ep ranks share E experts (E/ep each), each split over etp ranks; the tp/etp ranks of an expert
    shard split its tokens. Per expert GEMM: m = T·k·f·ep/E·etp/tp tokens (f: expert_token_factor),
    n = width/etp; E/ep of them per GPU, one grouped GEMM under token permutation
    (:func:`routed_experts_gemm_time`) — the per-GPU work, 2·g·h·width·T·k·f/tp, does not depend
    on ep or etp (DeepSpeed-TED, Singh et al. 2023, §3). ``routed``: the routed GEMMs' times where
    the caller has them (:func:`routed_experts_forward_times`)."""
    e = model.moe
    routed = routed_experts_forward_times(model, job, plan, curves) if routed is None else routed
    shared = mlp_gemm_forward_time(model, job, plan, curves, width=e.shared_experts * e.expert_ffn_hidden) \
        if e.shared_experts else 0.0
    router = curves.gemm_time(tokens_per_rank(job, plan), e.experts, model.hidden, _dtype(plan))
    return sum(routed) + shared + router + latent_projection_time(model, job, plan, curves)


def latent_projection_tokens(job, plan):
    """Tokens LatentMoE's projections see on one GPU: a sequence shard under sequence parallelism (the
    MoE layer's input is tp-split there), else every token of the micro-batch (the projections are
    duplicated on each tp rank: TELinear parallel_mode="duplicated")."""
    t = np.asarray(plan.tp, dtype=float)
    return tokens_per_rank(job, plan) / np.where(np.asarray(plan.sp, dtype=bool), t, 1.0)


def latent_projection_time(model, job, plan, curves):
    """Forward seconds of LatentMoE's two projections on one GPU (0 without a latent): fc1_latent_proj
    (T x h)·(h x ℓ) before the dispatch and fc2_latent_proj (T x ℓ)·(ℓ x h) after the combine,
    2·2·h·ℓ FLOPs per token (NVIDIA/Megatron-LM @ 0011998 megatron/core/transformer/moe/moe_layer.py,
    ``router_and_preprocess`` and ``combine``); T: :func:`latent_projection_tokens`."""
    ell = model.moe.latent_size
    if not ell:
        return 0.0
    T, h, dt = latent_projection_tokens(job, plan), model.hidden, _dtype(plan)
    return curves.gemm_time(T, ell, h, dt) + curves.gemm_time(T, h, ell, dt)


def routed_experts_wgrad_accumulation_time(model, job, plan, curves, routed=None):
    """Backward seconds the routed experts' weight-gradient GEMMs take beyond the forward-shaped
    price the backward gives every GEMM (backward = dgrad + wgrad = 2 x forward).

    Under fused gradient accumulation (``plan.grad_accumulation_fusion``; Megatron-LM
    --gradient-accumulation-fusion: the wgrad GEMM runs with beta = 1 on the parameter's main_grad,
    Transformer Engine's fuse_wgrad_accumulation, for the experts GroupedLinear's grouped wgrad GEMM
    with accumulate=True into their main gradients) each expert's wgrad GEMM (k x m)·(m x n) reads
    its two m-row operands and reads and writes the k x n main gradient, g = :func:`megatron_grad_bytes`
    per element each way (fp32: 4; bf16 with --grad-reduce-in-bf16: 2), where the forward moves the
    weight once in the GEMM's format. With few tokens per expert (m well below the weights' k, n)
    those bytes bind: up to 2g/w = 4x the forward's in bf16 with an fp32 main_grad. Per GEMM, with
    t_f its forward time (:func:`routed_experts_gemm_time`) and t0 the launch cost (once grouped,
    else per expert):

        extra = max(0, c·t0 + streaming(E_local·((mk + mn)·w + 2g·nk)) - t_f)

    the per-op roofline (cli99/llm-analysis analysis.py; calculon-ai/calculon's ``roofline`` mode)
    applied to the GEMM the backward runs; it equals max(t_f, roofline) - t_f where the
    accumulating wgrad moves at least the forward's bytes. 0 without the fusion (a 16-bit wgrad
    output moves the forward's bytes; the separate accumulation is accumulation.grad_accumulation_time)
    and where the GEMM is compute-bound (a dense layer's m is every token of the micro-batch, so
    dense GEMMs are left as they are). ``routed`` as for :func:`moe_mlp_forward_time`."""
    m, local, grouped, shapes = routed_expert_gemms(model, job, plan)
    routed = routed_experts_forward_times(model, job, plan, curves) if routed is None else routed
    w = GEMM_OPERAND_BYTES.get(_linear_dtype(plan), 2.0)
    accumulate = 2.0 * megatron_grad_bytes(plan)          # main_grad read and written
    launches = np.where(grouped, 1.0, local) * curves.kernel_overhead_s
    extra = 0.0
    for (n, k), forward in zip(shapes, routed):
        wgrad_bytes = local * ((m * k + m * n) * w + n * k * accumulate)
        extra = extra + np.maximum(0.0, launches + curves.streaming_time(wgrad_bytes, kernels=0) - forward)
    return np.where(np.asarray(plan.grad_accumulation_fusion, dtype=bool), extra, 0.0)


def einsum_dispatch_slots(model, job, plan):
    """S and E·C of DeepSpeed-MoE's einsum dispatch on one GPU: S = b·s/cp tokens (the gate runs on
    every tp rank's full copy of the micro-batch), E·C = S·top_k·factor capacity slots
    (C = ceil(k·S/E·capacity_factor) in ``top1gating``/``top2gating``; dropless: the busiest
    expert's count, here S/E·k·moe_imbalance)."""
    S = tokens_per_rank(job, plan)
    return S, S * model.moe.top_k * expert_token_factor(model, job)


def moe_einsum_dispatch_times(model, job, plan, curves):
    """(forward, backward) seconds of GShard-style einsum dispatch and combine in one MoE layer.

    DeepSpeed-MoE ``MOELayer.forward`` (deepspeed/moe/sharded_moe.py, the implementation DeepSpeed-
    MoE and DeepSpeed-TED ran; Lepikhin et al. 2020, GShard §2.2 for the formulation):
    ``dispatched = einsum("sec,sm->ecm", dispatch_mask, x)`` and
    ``out = einsum("sec,ecm->sm", combine_weights, expert_out)``; DeepSpeed evaluates both as one
    dense GEMM each, (E·C × S)·(S × h) and (S × E·C)·(E·C × h), 2·S·E·C·h FLOPs apiece with
    E·C = S·k·factor (:func:`einsum_dispatch_slots`), so the cost grows with the square of the
    tokens per micro-batch and does not shrink with tp. Backward: the gradient of x through the
    dispatch GEMM, and of expert_out and of the combine weights through the combine GEMM (3 GEMMs;
    the boolean dispatch mask takes none). Memory traffic: the S x E x C combine weights are built in
    fp32 (the gate runs in fp32), cast to a boolean mask and to two 16-bit GEMM operands: about
    4 + 1 + 2 + 2 bytes written and as many read per slot forward (18 bytes), twice that backward.
    Returns 0 for ``dispatch = "permute"`` (its copies are priced in
    :func:`dispatch_bytes_per_token`)."""
    if model.moe is None or model.moe.dispatch != "einsum":
        return 0.0, 0.0
    S, slots = einsum_dispatch_slots(model, job, plan)
    h, dt = model.moe_width, _dtype(plan)
    dispatch = curves.gemm_time(slots, h, S, dt)        # (E·C x S) @ (S x h)
    combine = curves.gemm_time(S, h, slots, dt)         # (S x E·C) @ (E·C x h)
    grad_weights = curves.gemm_time(S, slots, h, dt)    # d(combine weights) = d(out) @ expert_outᵀ
    wide = element_bytes(plan) / BYTES
    stream = curves.memory_time(18 * wide * S * slots, kernels=4)
    return dispatch + combine + stream, dispatch + combine + grad_weights + 2 * stream


# The routed experts' output biases under Megatron-Core (models with linear biases, GPT-OSS): TEGroupedMLP
# builds its fc2 with ``skip_bias_add=True`` and adds each expert's bias, scaled by the copy's router
# probability, after the grouped GEMM in eager PyTorch (megatron/core/transformer/moe/experts.py,
# ``TEGroupedMLP._apply_bias``: ``torch.cat([t + b * p for t, b, p in zip(torch.split(out, tokens_per_expert),
# biases, torch.split(probs, tokens_per_expert))])``), a loop over the local experts. Bytes per routed copy,
# 16-bit values h wide (the 16-bit router probabilities of a 16-bit router are 2 bytes per copy, not
# counted), forward: ``b * p`` written (2h), the add reads t and b·p and writes (6h), torch.cat reads and
# writes (4h): 12h, in 2 kernels per local expert and the cat. Backward (autograd): the multiply's two
# gradients, grad·p for the bias and grad·b for the probability, each written and read back by its
# reduction (2 x 6h), and the split's backward concatenating the slices' gradients (4h): 16h, in 4 kernels
# per local expert and the cat. Nothing more is kept for backward (the multiply keeps b and p).
EXPERT_BIAS_BYTES_PER_COPY_FORWARD = 2 + (2 + 2 + 2) + (2 + 2)
EXPERT_BIAS_BYTES_PER_COPY_BACKWARD = 2 * (2 + 2 + 2) + (2 + 2)
# TEGroupedMLP refuses bias_dropout_fusion with linear biases (an assertion in its constructor), so the
# attention output's bias is added apart from the residual: x + bias (read 2h, write 2h) and the residual
# add (read 4h, write 2h), 10h against the fused bias-dropout-add's 7h, one kernel more; backward the bias
# gradient's reduction reads the output gradient once more (2h).
UNFUSED_BIAS_ADD_BYTES_PER_HIDDEN_FORWARD = 10 - 7
UNFUSED_BIAS_ADD_BYTES_PER_HIDDEN_BACKWARD = 2


def megatron_expert_biases(model, plan):
    """Whether the plan's MoE layers add the routed experts' output biases in Megatron-Core's eager loop
    (:data:`EXPERT_BIAS_BYTES_PER_COPY_FORWARD`): Megatron-LM engine, a model with linear biases, token
    permutation (TEGroupedMLP): ``Behaviour.eager_expert_biases``."""
    engine = engine_flag(plan, "eager_expert_biases")
    if model.moe is None or not model.bias or model.moe.dispatch != "permute":
        return np.zeros(np.shape(engine), dtype=bool)
    return engine


def moe_expert_bias_times(model, job, plan, curves):
    """(forward, backward) seconds an MoE layer spends adding its biases outside the GEMMs under
    Megatron-Core (:func:`megatron_expert_biases`; 0 otherwise): the routed experts' output biases over
    the GPU's m·E/ep routed copies (:func:`routed_expert_gemms`), 12h bytes each forward and 16h backward
    (:data:`EXPERT_BIAS_BYTES_PER_COPY_FORWARD`, ``_BACKWARD``), and the attention output's bias added
    apart from the residual over the rank's T tokens (÷ tp under sequence parallelism), 3h forward and 2h
    backward (:data:`UNFUSED_BIAS_ADD_BYTES_PER_HIDDEN_FORWARD`), at the curves' streaming rate."""
    applies = megatron_expert_biases(model, plan)
    if not np.any(applies):
        return 0.0, 0.0
    m, local, _, _ = routed_expert_gemms(model, job, plan)
    copies = m * local
    T = tokens_per_rank(job, plan)
    t = np.asarray(plan.tp, dtype=float)
    tokens = T / np.where(np.asarray(plan.sp, dtype=bool), t, 1.0)
    h, wide = model.hidden, element_bytes(plan) / BYTES
    # plain multiplies, adds and copies whose bytes are counted exactly: the streaming rate
    ell = model.moe_width           # the routed copies' width (LatentMoE: ℓ)
    forward = curves.streaming_time(wide * (ell * copies * EXPERT_BIAS_BYTES_PER_COPY_FORWARD
                                            + h * tokens * UNFUSED_BIAS_ADD_BYTES_PER_HIDDEN_FORWARD),
                                    kernels=2 * local + 1 + 1)
    backward = curves.streaming_time(wide * (ell * copies * EXPERT_BIAS_BYTES_PER_COPY_BACKWARD
                                             + h * tokens * UNFUSED_BIAS_ADD_BYTES_PER_HIDDEN_BACKWARD),
                                     kernels=4 * local + 1 + 1)
    return np.where(applies, forward, 0.0), np.where(applies, backward, 0.0)


# Token permutation around the experts under ``dispatch = "permute"``, bytes in a forward pass (16-bit
# values, h wide). Megatron-Core's all-to-all dispatcher (MoEAlltoAllTokenDispatcher in
# megatron/core/transformer/moe/token_dispatcher.py, helpers in moe_utils.py) runs: ``permute`` (the fused
# kernel reads each token once, 2h, and writes its k copies in expert order, 2h each), the dispatch
# all-to-all, ``sort_chunks_by_idxs`` when a GPU holds several experts and ep > 1 (regroup the received
# copies by local expert: read and write, 4h per copy), the grouped GEMM, the inverse regrouping (4h per
# copy), the combine all-to-all and ``unpermute`` (read each copy, 2h, and sum it into its token, written
# once, 2h; the router probabilities were applied inside the experts' activation, TEGroupedMLP's
# weighted_bias_swiglu_impl). torchtitan's expert-parallel MoE makes the same passes
# (its token reorder before the all-to-all, ``_permute`` / ``_unpermute`` around the grouped mm after it,
# the score-weighted ``scatter_add``).
DISPATCH_BYTES_PER_COPY = 2 + 2                  # permute's write, unpermute's read
DISPATCH_SORT_CHUNKS_BYTES_PER_COPY = 2 * (2 + 2)
DISPATCH_BYTES_PER_TOKEN = 2 + 2                 # permute's read, unpermute's write


def sorts_received_chunks(model, plan):
    """Whether the dispatcher regroups the tokens an all-to-all delivered by local expert: ep > 1
    and more than one expert per GPU (Megatron-Core's ``num_local_experts > 1``)."""
    ep = np.asarray(getattr(plan, "ep", 1), dtype=float)
    return (ep > 1) & (model.moe.experts / ep > 1)


def dispatch_bytes_per_token(model, job, plan) -> float:
    """Bytes the token permutation streams per token in an MoE layer's forward (see the
    ``DISPATCH_*`` counts): (4 + 8·[regroup])·h per routed copy (k·f copies per token) + 4h per
    token. Under DeepEP / HybridEP (``plan.moe_flex_dispatch``) the kernels read the tokens and write
    one copy per destination GPU themselves; Megatron-Core's flex dispatcher then permutes those
    arrivals into expert order and unpermutes them before the combine: 4h per routed copy + 4h per
    arrival (:func:`expected_destinations` GPUs per token). GShard-style einsum dispatch
    (DeepSpeed-MoE) has none here: its dense dispatch and combine are priced in
    :func:`moe_einsum_dispatch_times`."""
    e = model.moe
    if e.dispatch != "permute":
        return 0.0
    copies = e.top_k * expert_token_factor(model, job, plan)
    sort = np.where(sorts_received_chunks(model, plan), DISPATCH_SORT_CHUNKS_BYTES_PER_COPY, 0)
    alltoall = (DISPATCH_BYTES_PER_COPY + sort) * copies + DISPATCH_BYTES_PER_TOKEN
    flex = np.asarray(getattr(plan, "moe_flex_dispatch", False), dtype=bool)
    if np.any(flex):
        ep = np.asarray(plan.ep, dtype=float)
        arrivals = expert_holders_per_token(e, e.experts / ep) * expert_token_factor(model, job, plan)
        alltoall = np.where(flex, DISPATCH_BYTES_PER_COPY * copies + DISPATCH_BYTES_PER_TOKEN * arrivals, alltoall)
    return alltoall * model.moe_width


def ep_alltoall_time(model, job, plan, cluster):
    """One expert-parallel all-to-all (dispatch or combine): each GPU sends its T·k·f/tp routed
    token copies of h values (LatentMoE: ℓ, ``model.moe_width``) across the ep group, which is carved from data parallelism (stride
    tp·cp in the rank order). DeepSpeed-MoE (Rajbhandari et al. 2022) §5;
    cli99/llm-analysis @ d841e40 analysis.py, get_latency_fwd_per_layer_mlp_moe_alltoall.
    Under ``plan.moe_flex_dispatch`` the DeepEP / HybridEP kernels' traffic instead
    (:func:`flex_dispatch_time`)."""
    if model.moe is None:
        return 0.0
    T = tokens_per_rank(job, plan)
    size = T * model.moe.top_k * expert_token_factor(model, job, plan) * model.moe_width * element_bytes(plan) / np.asarray(plan.tp, float)
    k = ranks_per_node(plan.ep, expert_group_strides(plan)[0], cluster.gpus_per_node)
    intra, inter = cluster.links("ep")
    alltoall = collective_time(ALL_TO_ALL, size, plan.ep, k, intra, inter)
    flex = np.asarray(getattr(plan, "moe_flex_dispatch", False), dtype=bool)
    if not np.any(flex):
        return alltoall
    return np.where(flex, flex_dispatch_time(model, job, plan, cluster), alltoall)


def _missed_by_picks(pool, held, picks: int):
    """C(pool − held, k) / C(pool, k) = Π_i (pool − held − i) / (pool − i): the chance that k distinct
    uniform picks from ``pool`` experts all miss a given ``held`` of them."""
    held = np.asarray(held, dtype=float)
    missed = np.ones_like(held)
    for i in range(picks):
        missed = missed * np.maximum(pool - held - i, 0.0) / (pool - i)
    return missed


def expected_destinations(experts: int, top_k: int, held, groups: int | None = None,
                          group_top_k: int | None = None):
    """Expected number of distinct holders (GPUs or nodes) a token's top-k experts sit on, when each of
    the ``experts / held`` holders keeps ``held`` consecutive experts and routing is uniform.

    Unlimited routing: a holder is missed by all k choices with probability C(E − held, k) / C(E, k).
    Group-limited routing (``groups`` groups of g = E/G consecutive experts, ``group_top_k`` = G_k of
    them picked uniformly, the k experts uniform among their G_k·g): a holder inside one group is hit
    with probability G_k/G · (1 − C(G_k·g − held, k) / C(G_k·g, k)); a holder of m whole groups is
    missed with probability Σ_j P(j of its groups picked) · C(G_k·g − j·g, k) / C(G_k·g, k), P(j)
    hypergeometric, C(m, j)·C(G − m, G_k − j) / C(G, G_k). A holder that neither sits inside one group
    nor holds whole groups is priced as unlimited routing (more destinations, the dearer bound)."""
    held = np.asarray(held, dtype=float)
    unlimited = experts / held * (1.0 - _missed_by_picks(experts, held, top_k))
    if groups is None or group_top_k is None or group_top_k >= groups:
        return unlimited
    size = experts / groups
    pool = group_top_k * size
    inside = group_top_k / groups * (1.0 - _missed_by_picks(pool, np.minimum(held, size), top_k))
    missed_with_m = np.array([sum(math.comb(m, j) * math.comb(groups - m, group_top_k - j)
                                  / math.comb(groups, group_top_k) * float(_missed_by_picks(pool, j * size, top_k))
                                  for j in range(0, min(m, group_top_k) + 1)) for m in range(groups + 1)])
    m = np.clip(np.rint(held / size), 0, groups).astype(int)
    spanning = 1.0 - missed_with_m[m]
    aligned_inside = (held <= size) & (np.mod(size, held) == 0)
    aligned_spanning = (held >= size) & (np.mod(held, size) == 0)
    return np.where(aligned_inside, experts / held * inside,
                    np.where(aligned_spanning, experts / held * spanning, unlimited))


def expert_holders_per_token(moe, held):
    """Expected distinct holders of ``held`` consecutive experts each (GPUs: E/ep; nodes: E·k_l/ep) that
    one token's routed experts sit on, under the model's routing (group-limited where its router is):
    :func:`expected_destinations`."""
    return expected_destinations(moe.experts, moe.top_k, held, moe.router_groups, moe.router_group_top_k)


def flex_dispatch_time(model, job, plan, cluster):
    """One DeepEP / HybridEP dispatch (or combine) of Megatron-Core's flex token dispatcher: a token
    goes once to every remote node that holds one of its experts (RDMA, to the GPU of the same local
    index there, which forwards it over NVLink to the node's other destination GPUs) and once to every
    destination GPU of its own node, instead of once per routed copy (DeepEP's normal kernels,
    github.com/deepseek-ai/DeepEP README). Expected distinct destinations under uniform routing,
    group-limited where the model's router is (DeepSeek-V3's node-limited routing: 4 of 8 groups, so
    over 8 nodes at most 4 a token): :func:`expected_destinations` with E/ep experts per GPU and
    E·k_l/ep per node (k_l ep ranks per node). Priced with the
    all-to-all's links and per-peer latencies (:func:`paraplan.costmodels.comm.collective_time`)."""
    e = model.moe
    T = tokens_per_rank(job, plan)
    ep = np.asarray(plan.ep, dtype=float)
    one_copy = T * expert_token_factor(model, job, plan) * model.moe_width * element_bytes(plan) / np.asarray(plan.tp, float)
    k_l = np.minimum(ranks_per_node(plan.ep, expert_group_strides(plan)[0], cluster.gpus_per_node), ep)
    nodes = ep / k_l
    gpus_hit = expert_holders_per_token(e, e.experts / ep)
    nodes_hit = expert_holders_per_token(e, e.experts * k_l / ep)
    remote_nodes = nodes_hit * (nodes - 1) / nodes
    own_node_gpus = gpus_hit * (k_l - 1) / ep
    forwarded = np.maximum(gpus_hit * (ep - k_l) / ep - remote_nodes, 0.0)
    intra, inter = cluster.links("ep")
    a_in, b_in = intra.alpha_beta(ALL_TO_ALL)
    a_out, b_out = inter.alpha_beta(ALL_TO_ALL)
    t = ((k_l - 1) * a_in + one_copy * (own_node_gpus + forwarded) / b_in
         + (nodes - 1) * a_out + one_copy * remote_nodes / b_out)
    return np.where(ep > 1, t, 0.0)


def moe_tp_collective_copies(model, plan):
    """Rows, in units of the layer's T tokens, that an MoE layer's MLP moves through tensor-parallel
    collectives per pass (all-gather forward, reduce-scatter back: one all-reduce equivalent each
    way, as a dense MLP's T rows). Megatron-Core's token dispatchers (moe/token_dispatcher.py) gather
    only over the expert-tensor-parallel group: with etp > 1 each rank all-gathers the routed copies
    of its etp peers (k·cf per token of its sequence shard, cf the capacity factor where tokens are
    padded) and reduce-scatters the experts' partial outputs back, k·cf·etp/tp rows of T; with etp 1
    the experts run whole on the rank's own tokens and, under sequence parallelism, the routed part
    moves nothing over tp. Without sequence parallelism (DeepSpeed-MoE under Megatron-DeepSpeed's
    tensor parallelism) every tp rank holds all T tokens: each keeps its 1/tp share for the experts
    (``drop_tokens``) and all-gathers the outputs after them (``gather_tokens``), whose backward is the
    reverse: one all-gather of T a pass, half an all-reduce equivalent. Shared experts run as a dense
    MLP over the tp group (one more T). Priced on the tp group (exact at etp = tp, the search's only
    expert tensor parallelism)."""
    routed, shared = moe_tp_routed_and_shared_copies(model, plan)
    return routed + shared


def moe_tp_routed_and_shared_copies(model, plan):
    """:func:`moe_tp_collective_copies` in its two parts, (routed, shared): the dispatcher's gathers of
    routed token copies (16-bit: gathered before any fp8 cast) and the shared experts' dense-MLP
    collectives (fp8 gathers where :func:`tp_gathers_fp8`)."""
    e = model.moe
    t = np.asarray(plan.tp, dtype=float)
    etp = np.asarray(getattr(plan, "etp", 1), dtype=float)
    sp = np.asarray(plan.sp, dtype=bool)
    routed = np.where(etp > 1, e.top_k * (e.capacity_factor or 1.0) * etp / t, np.where(sp, 0.0, 0.5))
    return routed, (1.0 if e.shared_experts else 0.0)


# Megatron-Core's dropless token dispatch copies the per-expert token counts to the host (the all-to-all
# splits and the grouped GEMM's per-expert sizes) and waits for them inside every MoE layer
# (megatron/core/transformer/moe/token_dispatcher.py: cuda_dtoh_point / cuda_sync_point; "no_sync" only
# with moe_pad_expert_input_to_capacity). The host therefore cannot queue work ahead across the layer,
# and an MoE layer costs at least the host's own time to issue it, forward and backward: a figure read
# from the Megatron-Bridge Qwen3-30B-A3B rows (fitted_constants.yaml), one for every GPU generation.
# Token-drop-and-pad (capacity factor set) has no sync and no floor.
MOE_HOST_SECONDS_PER_LAYER = fitted("moe_host_seconds_per_layer")


def moe_host_floor_applies(model, plan):
    """Whether the plan's MoE layers are host-bound at the MOE_HOST_SECONDS_PER_LAYER floor: Megatron-LM
    engine (``Behaviour.dropless_host_sync``), dropless (no capacity factor), permute dispatch."""
    host_sync = engine_flag(plan, "dropless_host_sync")
    if model.moe is None or model.moe.capacity_factor is not None or model.moe.dispatch != "permute":
        return np.zeros(np.shape(host_sync), dtype=bool)
    return host_sync


# The same share for an expert-parallel all-to-all running beside the other micro-batch's kernels under
# combined 1F1B (NCCL's all-to-all kernels, or DeepEP's, take SMs and HBM bandwidth the same way).
EP_OVERLAP_CONTENTION = TP_OVERLAP_CONTENTION


def ep_unpaired_share(job, plan):
    """Share of a stage's micro-batch passes that combined 1F1B cannot pair with a pass of the other
    direction: the warm-up forwards and cool-down backwards. Without pipelining one of m; in the
    interleaved schedule the first stage's warm-up, 2(p - 1) + (v - 1)·p model chunks, of m·v
    (Megatron-Core get_pp_rank_microbatches / combined_1f1b_schedule_for_no_pipelining)."""
    m = np.maximum(micro_batches(job, plan), 1.0)
    p = np.asarray(plan.pp, dtype=float)
    v = np.asarray(plan.vpp, dtype=float)
    warmup = np.where(p == 1, 1.0, 2 * (p - 1) + (v - 1) * p)
    share = np.minimum(1.0, warmup / (m * np.where(p == 1, 1.0, v)))
    return np.where(p > 1, dualpipe_unpaired_share(m, p, plan.schedule_code, share), share)


def dualpipe_unpaired_share(m, p, schedule_code, otherwise):
    """Share of a rank's passes that DualPipe and DualPipeV run alone, not in an overlapped forward-and-
    backward pair, on the ranks with the fewest pairs (the first and last, which set the pace):

    * DualPipe: (3p/2 − 1)/m. Its step() (dualpipe/dualpipe.py at bb214e8) runs m forwards per rank, of
      which steps 4 (2·(m/2 − p + h + 1) _forward_backward_chunk calls) and 5 (p/2 − h − 1) pair
      m − 3p/2 + h + 1, h = min(rank, p − 1 − rank);
    * DualPipeV: (3p − 1)/(2m). torch.distributed.pipelining's ScheduleDualPipeV (PyTorch 2.13) runs 2m
      chunk forwards per rank, 2m − 3p + 1 of them in OVERLAP_F_B actions on rank 0 (counted from its
      tables: 5 of 16 at p = 4, m = 8; 105 of 128 at p = 8, m = 64).

    ``otherwise`` for the other schedules."""
    sc = np.asarray(schedule_code)
    m = np.asarray(m, dtype=float)
    dual = np.minimum(1.0, (1.5 * p - 1) / m)
    dual_v = np.minimum(1.0, (3 * p - 1) / (2 * m))
    return np.where(sc == Schedule.DUALPIPE, dual, np.where(sc == Schedule.DUALPIPE_V, dual_v, otherwise))


def ep_exposed_time(a2a, attention_forward, attention_backward, moe_forward, moe_backward, job, plan):
    """Exposed expert-parallel all-to-all of one MoE layer and micro-batch (forward: dispatch and
    combine; backward: their gradients; each ``a2a`` seconds). ``moe_forward`` / ``moe_backward``:
    the whole MoE layer's compute; ``attention_forward`` / ``attention_backward``: its attention part
    (projections and core), the rest being the router, experts and elementwise kernels.

    Without overlap all four. With ``plan.ep_comm_overlap`` (Megatron-Core combined 1F1B,
    --overlap-moe-expert-parallel-comm; docs "Combined 1F1B: Expert-Parallel All-to-All Overlap") the
    forward of micro-batch i+1 and the backward of micro-batch i run layer by layer side by side, each
    all-to-all beside the other pass's block that does not wait on it: the backward's combine gradient
    beside the forward's attention, the forward's dispatch beside the backward's experts, the
    backward's dispatch gradient beside the forward's experts, the forward's combine beside the
    backward's attention. A paired pass exposes sum(max(0, a2a - window)) over those four windows plus
    the contention share of what they hide; the unpaired warm-up and cool-down passes
    (:func:`ep_unpaired_share`) expose all four. Memory is unchanged: while micro-batch i+1 saves layer
    l, micro-batch i has freed the layers above l, so a pair holds one micro-batch's activations."""
    plain = 4 * a2a
    overlap = np.asarray(getattr(plan, "ep_comm_overlap", False), dtype=bool)
    if not np.any(overlap):
        return plain
    windows = (attention_forward, moe_backward - attention_backward, moe_forward - attention_forward,
               attention_backward)
    hidden = sum(np.minimum(a2a, w) for w in windows)
    paired = sum(np.maximum(0.0, a2a - w) for w in windows) + EP_OVERLAP_CONTENTION * hidden
    u = ep_unpaired_share(job, plan)
    return np.where(overlap, u * plain + (1 - u) * paired, plain)


def moe_dispatch_assumption(model, job, plan, **_) -> tuple[str, ...]:
    """Said for an MoE model whose tokens are permuted to the experts (moe.dispatch_bytes_per_token,
    moe.flex_dispatch_time)."""
    if model.moe is None or model.moe.dispatch != "permute":
        return ()
    per_token = float(np.max(dispatch_bytes_per_token(model, job, plan))) / model.moe_width
    width = "hidden" if not model.moe.latent_size else f"latent ({model.moe.latent_size}, LatentMoE)"
    if getattr(plan, "moe_flex_dispatch", False):
        e = model.moe
        gpus = float(np.max(expert_holders_per_token(e, e.experts / max(plan.ep, 1))))
        routing = (f"uniform routing within {e.router_group_top_k} of {e.router_groups} expert groups, the model's "
                   f"group-limited router" if e.group_limited else "uniform routing")
        return (f"MoE: DeepEP / HybridEP dispatch (flex): a token crosses once to each node and GPU holding one of "
                f"its experts ({gpus:.1f} of the {plan.ep} expert-parallel GPUs on average, {routing}) instead "
                f"of once per routed copy ({e.top_k} a token); the arrivals are permuted into expert order and "
                f"back, {per_token:.0f} x {width} bytes per token and layer forward, twice that "
                f"backward; the SMs and buffers the kernels hold are not priced",)
    sort = bool(np.any(sorts_received_chunks(model, plan)))
    flex_ok = plan.ep > 1 and spec_of(plan).offers("moe_flex_dispatch")
    return (f"MoE: the token permutation streams {per_token:.0f} x {width} bytes per token and "
            f"layer forward, twice that backward (Megatron-Core's all-to-all dispatcher: permute, "
            f"{'regroup by local expert and back, ' if sort else ''}unpermute, the router weights applied in the experts' activation; "
            f"torchtitan's passes alike){'; --moe-flex-dispatch prices DeepEP / HybridEP instead' if flex_ok else ''}",)


def routing_imbalance_assumption(model, job, plan, **_) -> tuple[str, ...]:
    """Said for a dropless MoE plan whose routed work waits for a busier expert-parallel rank
    (:func:`routed_time_factor` > 1): the factor and where it comes from."""
    if model.moe is None or model.moe.capacity_factor:
        return ()
    f = float(np.max(routed_time_factor(job, plan)))
    if f <= 1.0:
        return ()
    if job.moe_imbalance is not None:
        return (f"MoE: the busiest expert-parallel rank routes {f:g}x the mean tokens (--moe-imbalance); its grouped "
                f"GEMMs and all-to-alls set each MoE layer's pace",)
    return (f"MoE: a trained router loads the busiest of the {plan.ep} expert-parallel ranks with {f:g}x the mean "
            f"routed tokens (FEPLB, arXiv:2604.19654, measured at EP 8); its grouped GEMMs and all-to-alls set each "
            f"MoE layer's pace; --moe-imbalance 1 for a router forced to balance (Megatron-Core's "
            f"moe_router_force_load_balancing, as in Megatron-Bridge's benchmarks)",)


def moe_host_assumption(model, plan, **_) -> tuple[str, ...]:
    """Said when the plan's MoE layers carry the host-bound floor (moe.MOE_HOST_SECONDS_PER_LAYER)."""
    if not bool(np.any(moe_host_floor_applies(model, plan))):
        return ()
    return (f"MoE: Megatron-Core's dropless dispatch waits for per-expert token counts on the host in every MoE "
            f"layer, so a layer takes at least {1e3 * MOE_HOST_SECONDS_PER_LAYER:.1f} ms per micro-batch "
            f"(forward + backward, host-bound; read from one calibration row); a capacity factor (token drop "
            f"and pad) removes the wait",)


def expert_wgrad_assumption(model, job, plan, curves, **_) -> tuple[str, ...]:
    """Said when the routed experts' fused gradient accumulation binds their weight-gradient GEMMs
    (moe.routed_experts_wgrad_accumulation_time > 0)."""
    if model.moe is None:
        return ()
    extra = float(np.max(routed_experts_wgrad_accumulation_time(model, job, plan, curves)))
    if extra <= 0:
        return ()
    m = float(np.max(routed_expert_gemms(model, job, plan)[0]))
    g = float(np.max(megatron_grad_bytes(plan)))
    return (f"MoE: the routed experts' weight-gradient GEMMs accumulate into {'fp32' if g >= 4 else 'bf16'} main "
            f"gradients (gradient-accumulation fusion), {g:.0f} bytes read and {g:.0f} written per weight; with "
            f"{m:.0f} tokens per expert they are bound by those bytes: +{1e3 * extra:.2f} ms per MoE layer and "
            f"micro-batch over a forward-shaped wgrad (a larger micro-batch or more expert parallelism gives each "
            f"expert more tokens)",)


def expert_bias_assumption(model, job, plan, curves, **_) -> tuple[str, ...]:
    """Said where Megatron-Core adds a biased model's expert biases outside the GEMMs
    (moe.moe_expert_bias_times)."""
    if not bool(np.any(megatron_expert_biases(model, plan))):
        return ()
    f, b = (1e3 * float(np.max(x)) for x in moe_expert_bias_times(model, job, plan, curves))
    return (f"MoE with linear biases on Megatron-Core: TEGroupedMLP adds each expert's output bias, scaled by the "
            f"router probability, in an eager loop after the grouped GEMM ({EXPERT_BIAS_BYTES_PER_COPY_FORWARD} x "
            f"hidden bytes per routed copy forward, {EXPERT_BIAS_BYTES_PER_COPY_BACKWARD} backward) and refuses the "
            f"fused bias-dropout-add: {f:.2f} ms forward and {b:.2f} ms backward per MoE layer and micro-batch",)


def ep_overlap_assumption(job, plan, **_) -> tuple[str, ...]:
    """Said when the plan overlaps its expert-parallel all-to-alls (moe.ep_exposed_time)."""
    if not getattr(plan, "ep_comm_overlap", False):
        return ()
    u = float(ep_unpaired_share(job, plan))
    sc = int(np.max(np.asarray(plan.schedule_code)))
    pairing = ("DualPipe (DeepSeek-V3 sec. 3.2.1, its overlapped forward-and-backward chunks)"
               if sc == Schedule.DUALPIPE and plan.pp > 1 else
               "DualPipeV (ScheduleDualPipeV's OVERLAP_F_B actions)" if sc == Schedule.DUALPIPE_V and plan.pp > 1
               else "combined 1F1B")
    return (f"MoE: {pairing} pairs each micro-batch's forward with another's backward, layer by layer; a "
            f"paired pass hides its dispatch/combine all-to-alls under the other direction's compute (the hidden "
            f"part still costs {100 * EP_OVERLAP_CONTENTION:.0f} % of its duration), and the {100 * u:.1f} % of "
            f"passes left unpaired (warm-up and cool-down) expose theirs",)
