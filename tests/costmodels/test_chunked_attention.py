"""Llama 4's chunked local attention: on three of four layers a query attends causally to its own chunk of
8192 tokens only, so above 8k tokens those layers cost a fraction of full attention; the model FLOPs count
the same keys."""
from dataclasses import replace

import pytest

from paraplan.costmodels.attention import attention_core_times
from paraplan.costmodels.efficiency import curves_for
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model, model_from_hf_config, model_from_mapping
from paraplan.workloads.transformer import TrainingJob

SCOUT = load_model("llama4-scout")
FULL = replace(SCOUT, attention_chunk=0, global_attention_every=0)


def test_keys_per_query_follow_the_chunks():
    assert SCOUT.chunked_layer_share == pytest.approx(0.75)
    for s in (2048, 8192):        # a chunk as long as the sequence: full causal attention
        assert SCOUT.attention_keys_per_query(s, True) == pytest.approx(FULL.attention_keys_per_query(s, True))
    # 32k tokens: a global layer's query meets 16,384 keys on average, a chunked one's 4,096
    assert SCOUT.attention_keys_per_query(32768, True) == pytest.approx(0.25 * 16384 + 0.75 * 4096)
    assert SCOUT.attention_keys_per_query(32768) == pytest.approx(0.25 * 32768 + 0.75 * 8192)
    # 20k tokens: two chunks of 8192 and one of 3616
    assert SCOUT.attention_keys_per_query(20000) == pytest.approx(0.25 * 20000 + 0.75 * (2 * 8192**2 + 3616**2) / 20000)


@pytest.mark.parametrize("engine", ["generic", "megatron"])
def test_attention_time_drops_above_the_chunk_only(engine):
    """At 8k the chunk is the sequence; at 32k three layers in four run four 8k chunks each instead of one
    32k causal attention: at the calibrated fused efficiency (generic: time in proportion to the keys,
    0.25 + 0.75 / 4 of full) and on the measured cuDNN table Megatron runs (its 8k efficiency for the
    chunks, its 32k one for the global layers)."""
    cluster = load_cluster("dgx-h100", 8)
    plan = Plan(tp=8, micro_batch=1, engine=engine)
    curves = curves_for(cluster.accelerator)
    times = {}
    for s in (8192, 32768):
        job = TrainingJob(s, 8)
        times[s] = [sum(attention_core_times(m, job, plan, curves)) for m in (SCOUT, FULL)]
    assert times[8192][0] == pytest.approx(times[8192][1])
    ratio = times[32768][0] / times[32768][1]
    if engine == "generic":
        assert ratio == pytest.approx(0.25 + 0.75 / 4, rel=0.01)
    else:
        assert 0.4 < ratio < 0.55, times


def test_model_files_and_hf_configs_carry_it_and_bad_input_names_the_field():
    hf = {"model_type": "llama4_text", "num_hidden_layers": 8, "hidden_size": 512, "num_attention_heads": 8,
          "num_key_value_heads": 2, "intermediate_size": 1024, "vocab_size": 1000, "hidden_act": "silu",
          "rope_theta": 500000, "attention_chunk_size": 8192, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]}
    m = model_from_hf_config(hf, "config.json")
    assert (m.attention_chunk, m.global_attention_every) == (8192, 4)
    m = model_from_hf_config({k: v for k, v in hf.items() if k != "no_rope_layers"}, "config.json")
    assert m.global_attention_every == 4          # transformers' no_rope_layer_interval default
    base = {"name": "x", "layers": 4, "hidden": 256, "heads": 4, "vocab": 100}
    assert model_from_mapping({**base, "attention_chunk": 1024}, "m.yaml").chunked_layer_share == 1.0
    with pytest.raises(ConfigError, match="attention_chunk"):
        model_from_mapping({**base, "attention_chunk": 1024, "sliding_window": 128}, "m.yaml")
    with pytest.raises(ConfigError, match="attention_chunk"):
        model_from_mapping({**base, "attention_chunk": -1}, "m.yaml")
