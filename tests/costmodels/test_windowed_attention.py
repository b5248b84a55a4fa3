"""Sliding-window attention on the measured kernel tables: a windowed layer runs like causal attention
over the length whose query tiles visit as many key tiles (attention.windowed_attention_equivalent), not at
the whole sequence's efficiency."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paraplan.costmodels.attention import attention_core_times, windowed_attention_equivalent
from paraplan.costmodels.efficiency import analytical_curves
from paraplan.costmodels.estimate import estimate
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.transformer import TrainingJob, TransformerModel

H100 = load_cluster("dgx-h100", 8)
CURVES = analytical_curves(H100.accelerator)
CUDNN = Plan(micro_batch=1, attention_kernel="cudnn")


def _model(window=0, every=1):
    return TransformerModel(name="swa", layers=4, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                            vocab=32000, activation="swiglu", rotary=True, sliding_window=window,
                            sliding_window_every=every)


def _core(model, seq, plan=CUDNN):
    f, b = attention_core_times(model, TrainingJob(seq, 8), plan, CURVES)
    return float(f), float(b)


def test_equivalent_length_counts_key_tiles():
    # a 128-key window spans 2 key tiles per query tile: causal attention over 3 tiles (384 tokens)
    # averages 2; 32 query tiles visit 63 tile pairs, 10.5 such sequences
    length, copies, share = windowed_attention_equivalent(128, 4096)
    assert (length, copies) == (384.0, 10.5) and share == pytest.approx(10.5 * 384 ** 2 / 4096 ** 2)
    # 4096 keys at 32k: 33 key tiles per query tile, causal attention over 65 tiles
    assert windowed_attention_equivalent(4096, 32768)[0] == 8320.0
    # a window as long as the sequence is the causal attention over it
    assert windowed_attention_equivalent(8192, 8192) == (8192.0, 1.0, 1.0)


def test_counted_keys_of_a_causal_window():
    """Queries 1..w meet 1..w keys, the rest w: w - w²/(2s) on average (counted causally); a window as
    long as the sequence is s/2."""
    m = _model(window=4096)
    assert m.attention_keys_per_query(8192, causal_halved=True) == 4096 - 4096 ** 2 / (2 * 8192)
    assert _model(window=8192).attention_keys_per_query(8192, causal_halved=True) == 4096
    assert m.attention_keys_per_query(8192) == 4096       # the FLOP convention (not halved) is unchanged


def test_a_window_as_long_as_the_sequence_prices_as_full_attention():
    full = _core(_model(), 8192)
    assert _core(_model(window=8192), 8192) == pytest.approx(full, rel=1e-12)
    assert _core(_model(window=65536, every=2), 8192) == pytest.approx(full, rel=1e-12)


def test_windowed_layers_cost_more_per_counted_flop_and_less_than_full_attention():
    """A 1024-key window at 32k tokens: its FLOPs at the 32k efficiency would be the lower bound; the
    tiles of a 2176-token causal sequence run at a lower efficiency, and it never costs what full
    attention does."""
    seq = 32768
    full_f, _ = _core(_model(), seq)
    win_f, win_b = _core(_model(window=1024), seq)
    at_full_efficiency = CURVES.kernel_overhead_s + (full_f - CURVES.kernel_overhead_s) * 1024 / (seq / 2)
    assert at_full_efficiency * 1.3 < win_f < full_f / 4
    assert win_b == pytest.approx(CURVES.kernel_overhead_s + 2.5 * (win_f - CURVES.kernel_overhead_s), rel=1e-12)


def test_time_grows_with_the_window_and_with_the_windowed_share():
    times = [_core(_model(window=w), 8192)[0] for w in (128, 256, 512, 1024, 2048, 4096, 6144, 8192)]
    assert np.all(np.diff(times) > 0)
    halves = [_core(_model(window=1024, every=k), 8192)[0] for k in (1, 2, 4)]
    assert np.all(np.diff(halves) > 0)          # fewer windowed layers: more full attention


def test_auto_on_an_unmeasured_engine_keeps_the_counted_flops_and_the_estimate_says_what_windows_run_at():
    model = _model(window=1024)
    plain = Plan(micro_batch=1)                 # generic engine, auto: the calibrated constant, as before
    f, _ = _core(model, 8192, plain)
    keys = 1024 - 1024 ** 2 / (2 * 8192)        # a query's keys under the causal window, on average
    flops = 4.0 * 8192 * model.hidden * keys    # queries x keys x (q + out width) x 2, one layer
    assert f == pytest.approx(CURVES.kernel_overhead_s + flops / (989e12 * CURVES.flash_attention_efficiency),
                              rel=1e-9)
    e = estimate(model, TrainingJob(8192, 8), H100, replace(CUDNN, dp=8))
    line = next(a for a in e.assumptions if a.startswith("attention: cudnn"))
    assert "1024-key sliding-window layers run as causal attention over 2176 tokens" in line


def test_context_parallel_ranks_pay_for_their_own_queries_windows():
    """Under context parallelism a rank runs its s/cp queries' windows: the windowed layer's time falls
    with cp like the rest of the step's work, where full causal attention's does too."""
    model = _model(window=1024)
    one = attention_core_times(model, TrainingJob(32768, 8), CUDNN, CURVES)[0]
    cp4 = attention_core_times(model, TrainingJob(32768, 8), replace(CUDNN, cp=4), CURVES)[0]
    assert float(cp4) == pytest.approx(float(one) / 4, rel=0.05)
