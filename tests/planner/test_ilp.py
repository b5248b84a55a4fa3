"""ILPs of paraplan.planner.ilp against brute force, plus the layouts they should prefer."""
import itertools
import math
import random
import time

import pytest

from paraplan.errors import InfeasiblePlan
from paraplan.planner.ilp import (LayerCost, PipelineSpec, StageRecomputeCost, build_partition_ilp,
                                  build_recompute_ilp, in_flight_per_stage, partition_stages,
                                  partition_stages_dp, plan_recompute, recompute_fewest_that_fit,
                                  recompute_plan_from_counts)

GiB = 2**30


# ------------------------------------------------------------------ brute force
def brute_partition(layers, spec):
    """min over all contiguous non-empty splits of the slowest stage; None if nothing fits."""
    n, p, k = len(layers), spec.stages, spec.in_flight
    best = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        b = (0,) + cuts + (n,)
        segs = [layers[b[s]:b[s + 1]] for s in range(p)]
        if any(sum(l.weight_bytes + k[s] * l.activation_bytes for l in seg) + spec.fixed_bytes_per_stage
               > spec.memory_cap_bytes for s, seg in enumerate(segs)):
            continue
        t = max(math.fsum(l.time_s for l in seg) for seg in segs)
        best = t if best is None else min(best, t)
    return best


def brute_recompute(stages, cap):
    """(slowest stage, total added time) minimised lexicographically over all r vectors."""
    best = None
    for r in itertools.product(*(range(st.layers + 1) for st in stages)):
        if any(st.memory_bytes(x) > cap for st, x in zip(stages, r)):
            continue
        key = (max(st.time_s(x) for st, x in zip(stages, r)),
               math.fsum(x * st.recompute_time_per_layer_s for st, x in zip(stages, r)))
        best = key if best is None or key < best else best
    return best


def random_partition_instance(rng):
    n, p = rng.randint(4, 10), rng.randint(2, 4)
    p = min(p, n)
    layers = [LayerCost(f"l{i}", round(rng.uniform(0.1, 2.0), 3), rng.randint(1, 8) * GiB // 4,
                        rng.randint(0, 8) * GiB // 16) for i in range(n)]
    m = rng.randint(1, 8)
    schedule = rng.choice(["1f1b", "gpipe"])
    k = in_flight_per_stage(p, m, schedule)
    # cap: between the lightest single layer and everything on one stage, so it often binds
    heaviest = sum(l.weight_bytes + k[0] * l.activation_bytes for l in layers)
    lightest = min(l.weight_bytes + k[-1] * l.activation_bytes for l in layers)
    cap = rng.randint(lightest, heaviest) if rng.random() < 0.8 else math.inf
    return layers, PipelineSpec(p, m, schedule, memory_cap_bytes=cap, fixed_bytes_per_stage=rng.choice([0, GiB // 8]))


def close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


# ------------------------------------------------------------------ partitioning
def test_partition_ilp_and_dp_match_brute_force_on_random_instances():
    rng = random.Random(20240501)
    feasible = infeasible = 0
    for _ in range(60):
        layers, spec = random_partition_instance(rng)
        want = brute_partition(layers, spec)
        for solve in (lambda layers=layers, spec=spec: partition_stages(layers, spec, warm_start=False, time_limit_s=20),
                      lambda layers=layers, spec=spec: partition_stages_dp(layers, spec)):
            if want is None:
                with pytest.raises(InfeasiblePlan):
                    solve()
            else:
                got = solve()
                assert got.status == "Optimal"
                assert close(got.bottleneck_time_s, want), (layers, spec, got, want)
                assert all(m <= spec.memory_cap_bytes for m in got.stage_memory_bytes)
                assert len(got.boundaries) == spec.stages and got.boundaries[0] == 0
        feasible += want is not None
        infeasible += want is None
    assert feasible >= 20 and infeasible >= 5       # both kinds were exercised


def test_partition_model_names_every_constraint():
    layers = [LayerCost(f"l{i}", 1.0, GiB, GiB // 4) for i in range(6)]
    model = build_partition_ilp(layers, PipelineSpec(3, 4, memory_cap_bytes=20 * GiB))
    names = {c.name for c in model.problem.constraints()}
    assert {"memory_stage_0", "time_stage_2", "nonempty_stage_1", "contiguous_0_0", "stage_order_0_0"} <= names
    assert set(model.on_or_before) == {(i, s) for i in range(6) for s in range(3)}


def gpt_layers(n_transformer, head_time=3.0):
    return ([LayerCost("embedding", 0.2, 2 * GiB, GiB // 8)]
            + [LayerCost(f"layer{i}", 1.0, GiB, GiB // 2) for i in range(n_transformer)]
            + [LayerCost("lm_head", head_time, 2 * GiB, 2 * GiB)])


def test_heavy_lm_head_gets_fewer_transformer_layers():
    layers = gpt_layers(16)
    spec = PipelineSpec(4, 8, "1f1b")
    for part in (partition_stages(layers, spec, warm_start=False), partition_stages_dp(layers, spec)):
        last_transformer = len(layers) - 1 - part.boundaries[-1]     # layers on the last stage, less the head
        assert last_transformer < 16 // 4
        assert part.bottleneck_time_s < 16 // 4 + 3.0                 # beats the uniform split


def test_1f1b_first_stage_gets_fewer_layers_under_a_binding_cap():
    layers = [LayerCost(f"layer{i}", 1.0, GiB, GiB) for i in range(16)]
    free = partition_stages_dp(layers, PipelineSpec(4, 8, "1f1b"))
    assert free.layers_per_stage(16) == (4, 4, 4, 4)
    # 4 layers on stage 0 need 4·(1 + 4·1) = 20 GiB; cap 16 GiB binds only on the early stages
    spec = PipelineSpec(4, 8, "1f1b", memory_cap_bytes=16 * GiB)
    for part in (partition_stages(layers, spec, warm_start=False), partition_stages_dp(layers, spec)):
        per = part.layers_per_stage(16)
        assert per[0] < per[-1] and per[0] == min(per)
        assert part.bottleneck_time_s > free.bottleneck_time_s
    # GPipe holds m on every stage: no reason to favour the last stage
    gp = partition_stages_dp(layers, PipelineSpec(4, 2, "gpipe", memory_cap_bytes=16 * GiB))
    assert gp.layers_per_stage(16) == (4, 4, 4, 4)


def test_infeasible_partition_names_the_overflow():
    layers = [LayerCost(f"layer{i}", 1.0, GiB, GiB) for i in range(8)]
    spec = PipelineSpec(4, 8, "1f1b", memory_cap_bytes=4 * GiB)      # stage 0 alone needs 1 + 4 = 5 GiB
    for solve in (lambda: partition_stages(layers, spec, warm_start=False), lambda: partition_stages_dp(layers, spec)):
        with pytest.raises(InfeasiblePlan, match=r"stage 0 needs 5\.00 GiB even with one layer.*over by 1\.00 GiB"):
            solve()
    # every stage can hold one layer but 8 layers on 2 stages cannot fit: least-overflow split
    spec = PipelineSpec(2, 1, "1f1b", memory_cap_bytes=6 * GiB)      # 4 layers need 4·(1+1) = 8 GiB
    with pytest.raises(InfeasiblePlan, match=r"overflows least.*needs 8\.00 GiB.*over by 2\.00 GiB"):
        partition_stages_dp(layers, spec)
    with pytest.raises(InfeasiblePlan, match=r"3 layers cannot fill 4 pipeline stages"):
        partition_stages_dp(layers[:3], PipelineSpec(4, 4))


@pytest.mark.slow
def test_realistic_size_partition_returns_within_the_time_limit():
    rng = random.Random(7)
    layers = ([LayerCost("embedding", 0.3, 2 * GiB, GiB // 5)]
              + [LayerCost(f"layer{i}", 1.0 + 0.01 * rng.random(), GiB, GiB // 2) for i in range(126)]
              + [LayerCost("lm_head", 2.5, 2 * GiB, GiB)])
    spec = PipelineSpec(64, 128, "1f1b", memory_cap_bytes=80 * GiB)
    dp = partition_stages_dp(layers, spec)
    start = time.perf_counter()
    ilp = partition_stages(layers, spec, time_limit_s=5)
    elapsed = time.perf_counter() - start
    print(f"\n128 layers / 64 stages: DP {dp.solve_time_s:.3f} s, ILP (warm) {elapsed:.1f} s, {ilp.status}")
    assert close(ilp.bottleneck_time_s, dp.bottleneck_time_s)


# ------------------------------------------------------------------ recomputation
def random_recompute_instance(rng):
    p = rng.randint(2, 4)
    m = rng.randint(1, 6)
    k = in_flight_per_stage(p, m, "1f1b")
    stages = [StageRecomputeCost(layers=rng.randint(0, 5), base_time_s=round(rng.uniform(1, 5), 3),
                                 static_bytes=rng.randint(1, 20) * GiB // 4, in_flight=k[s],
                                 activation_bytes_per_layer=rng.randint(1, 16) * GiB // 8,
                                 recomputed_activation_bytes_per_layer=rng.randint(0, 2) * GiB // 16,
                                 recompute_time_per_layer_s=round(rng.uniform(0.05, 1.0), 3))
              for s in range(p)]
    most = max(st.memory_bytes(0) for st in stages)
    least = max(min(st.memory_bytes(0), st.memory_bytes(st.layers)) for st in stages)
    return stages, rng.randint(int(least * 0.9), int(most * 1.05))


def test_recompute_ilp_matches_brute_force_on_random_instances():
    rng = random.Random(99)
    feasible = infeasible = 0
    for _ in range(60):
        stages, cap = random_recompute_instance(rng)
        want = brute_recompute(stages, cap)
        if want is None:
            infeasible += 1
            with pytest.raises(InfeasiblePlan, match="over by"):
                plan_recompute(stages, cap)
            continue
        feasible += 1
        got = plan_recompute(stages, cap)
        assert close(got.bottleneck_time_s, want[0]) and close(got.added_time_s, want[1]), (stages, cap, got, want)
        assert all(m <= cap for m in got.stage_memory_bytes)
        assert all(0 <= r <= st.layers for r, st in zip(got.layers_recomputed, stages))
    assert feasible >= 20 and infeasible >= 5


def test_fewest_layers_that_fit_is_the_recompute_ilps_optimum():
    """The closed form the planner uses (each stage's fewest recomputed layers that fit) reaches the ILP's
    slowest stage and added time on every random instance, fails where it fails, with the same message;
    where recomputing costs time on every stage the layers are the ILP's too (the optimum is unique)."""
    rng = random.Random(99)
    checked = 0
    for _ in range(60):
        stages, cap = random_recompute_instance(rng)
        want = brute_recompute(stages, cap)
        if want is None:
            with pytest.raises(InfeasiblePlan) as closed:
                recompute_fewest_that_fit(stages, cap)
            with pytest.raises(InfeasiblePlan) as ilp:
                plan_recompute(stages, cap)
            assert str(closed.value) == str(ilp.value)
            continue
        got, ilp = recompute_fewest_that_fit(stages, cap), plan_recompute(stages, cap)
        assert close(got.bottleneck_time_s, want[0]) and close(got.added_time_s, want[1]), (stages, cap, got, want)
        assert got.status == "Optimal" and all(m <= cap for m in got.stage_memory_bytes)
        if all(st.recompute_time_per_layer_s > 0 for st in stages):
            assert got.layers_recomputed == ilp.layers_recomputed
            checked += 1
    assert checked >= 20


def test_fewest_layers_that_fit_breaks_free_ties_towards_fewer_layers():
    """A stage whose recomputation costs no time (a host-bound MoE layer recomputes inside its wait): any r
    that fits is optimal; the closed form recomputes the fewest, deterministically."""
    free = StageRecomputeCost(4, 1.0, 0, 4, GiB, 0, 0.0)                 # 4·(4−r)·1 GiB + 1 GiB ≤ 10 GiB ⇒ r ≥ 2
    assert recompute_fewest_that_fit([free], 10 * GiB).layers_recomputed == (2,)


def test_recompute_model_names_every_constraint():
    st = StageRecomputeCost(4, 1.0, GiB, 2, GiB, GiB // 8, 0.1)
    model = build_recompute_ilp([st, st], 10 * GiB)
    assert {"time_stage_1", "memory_stage_0", "recompute_switch_1"} <= {c.name for c in model.problem.constraints()}
    assert set(model.recomputed) == {0, 1}


def test_1f1b_first_stage_recomputes_most():
    p, m = 4, 8
    k = in_flight_per_stage(p, m, "1f1b")
    stages = [StageRecomputeCost(8, 8.0, 20 * GiB, k[s], 2 * GiB, GiB // 8, 0.33) for s in range(p)]
    plan = plan_recompute(stages, 40 * GiB)
    r = plan.layers_recomputed
    assert r[0] == max(r) and r[0] > r[-1] and list(r) == sorted(r, reverse=True)
    # the fewest layers that fit on each stage: one fewer would overflow
    for st, x in zip(stages, r):
        assert x == 0 or st.memory_bytes(x - 1) > 40 * GiB


def test_recompute_tie_break_takes_least_added_time():
    # stage 0 must recompute 3 layers (bottleneck 1 + 3·1 = 4); stage 1 fits without any
    fast = StageRecomputeCost(4, 1.0, 0, 4, GiB, 0, 1.0)                 # 4·(4−r)·1 GiB + 1 GiB ≤ 6 GiB ⇒ r ≥ 3
    slack = StageRecomputeCost(4, 1.0, 0, 1, GiB, 0, 0.5)                # 4 GiB fits with r = 0
    plan = plan_recompute([fast, slack], 6 * GiB)
    assert plan.layers_recomputed == (3, 0) and plan.added_time_s == 3.0
    assert plan == recompute_plan_from_counts([fast, slack], (3, 0), status="Optimal", solve_time_s=plan.solve_time_s)


def test_infeasible_recompute_names_the_overflow():
    st = StageRecomputeCost(8, 8.0, 20 * GiB, 4, 2 * GiB, GiB // 8, 0.33)   # full: 20 + 4·8·⅛ + 2 = 26 GiB
    with pytest.raises(InfeasiblePlan, match=r"stage 0 needs 26\.00 GiB even with all 8 of 8 layers.*over by 2\.00 GiB"):
        plan_recompute([st], 24 * GiB)


def test_ilp_solves_emit_no_warning():
    """pulp 3.3 deprecates LpVariable(...), PULP_CBC_CMD and constraints as a mapping (issue 67: a
    DeprecationWarning on every ILP, filtered in pyproject.toml); both ILPs build and solve without one."""
    import warnings
    layers = gpt_layers(6)
    st = StageRecomputeCost(4, 1.0, GiB, 2, GiB, GiB // 8, 0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        partition_stages(layers, PipelineSpec(3, 4, memory_cap_bytes=40 * GiB), time_limit_s=20)
        partition_stages(layers, PipelineSpec(3, 4, memory_cap_bytes=40 * GiB), warm_start=True, time_limit_s=20)
        plan_recompute([st, st], 10 * GiB)
    assert not caught, [str(w.message) for w in caught]
