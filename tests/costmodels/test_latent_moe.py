"""LatentMoE (Nemotron 3 Super 120B-A12B): the routed experts, the token permutation and the all-to-alls
at the latent width, the two projections as GEMMs and parameters, the shared experts and router at the
hidden width (NVIDIA/Megatron-LM @ 0011998 megatron/core/transformer/moe/moe_layer.py: the router reads the
h-wide token, ``fc1_latent_proj`` runs before the dispatch, ``fc2_latent_proj`` after the combine;
megatron/core/transformer/mlp.py: ``moe_latent_size`` only for routed experts). Golden numbers by hand from
the Super configuration (Megatron-LM's Nemotron 3 Super example arguments, the Hugging Face config.json)."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.costmodels import memory as M
from paraplan.costmodels import moe as MOE
from paraplan.costmodels.efficiency import curves_for
from paraplan.costmodels.kernels import _dtype
from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

S = load_model("nemotron3-super-120b-a12b")
JOB = TrainingJob(8192, 1536, moe_imbalance=1.0)   # balanced: the byte counts below are per balanced share
B200 = load_cluster("dgx-b200", 256)
DATA = Path(__file__).parents[1] / "workloads" / "data" / "written"
h, ell, E, k, f, V = 4096, 1024, 512, 22, 2688, 131072


def _plan(**kw):
    return Plan(**{"engine": "megatron", "zero": 1, "ep": 8, **kw}).with_dp_for(B200.num_gpus)


def test_nemotron3_super_parameters_tensor_by_tensor():
    """Mamba-2: in_proj 4096 x (2·8192 + 2·8·128 + 128), conv (8192 + 2048) x (4 + bias), A_log / D / dt_bias
    3·128, gated norm 8192, out_proj 8192 x 4096, pre-norm; attention: QKV 4096 x (4096 + 2·256), out 4096 x
    4096, pre-norm; MoE: router 4096 x 512, fc1_latent_proj 4096 x 1024 and fc2_latent_proj 1024 x 4096,
    512 routed experts of 2·1024·2688 (squared ReLU, latent wide), the shared expert 2·4096·5376 (hidden
    wide), pre-norm; untied embedding and head 131072 x 4096, final norm."""
    mamba = h * 18560 + 10240 * 5 + 3 * 128 + 8192 + 8192 * h + h
    attention = h * (4096 + 512) + 4096 * h + h
    moe = h * E + 2 * h * ell + E * 2 * ell * f + 2 * h * 5376 + h
    assert (S.kind_params("mamba"), S.kind_params("attention"), S.kind_params("moe")) == (mamba, attention, moe)
    assert S.latent_projection_params == 2 * h * ell and S.routed_expert_mlp_params == 2 * ell * f
    assert S.expert_mlp_params == 2 * h * f       # the shared expert's, hidden wide
    total = 40 * mamba + 8 * attention + 40 * moe + 2 * V * h + h
    assert S.num_params == total == 120_668_687_360
    active = 40 * mamba + 8 * attention + 40 * (h * E + 2 * h * ell + k * 2 * ell * f + 2 * h * 5376 + h) + 2 * V * h + h
    assert S.active_params == active == 12_770_216_960
    # the model card and arXiv:2604.12374: "120B total, 12B active" (+0.6 % total; active 12.77B with the
    # embeddings, 11.70B without)
    assert S.num_params / 120e9 == pytest.approx(1.0, abs=0.006)
    assert (S.active_params - 2 * V * h) / 1e9 == pytest.approx(11.70, abs=0.01)
    # priced at the hidden width, the routed experts alone would be 4x: 4 x 2.82B per layer
    wide = replace(S, moe=replace(S.moe, latent_size=0))
    assert wide.routed_expert_params_per_moe_layer == 4 * S.routed_expert_params_per_moe_layer


def test_flops_of_one_latent_moe_layer():
    """Forward weight-GEMM FLOPs per token: router 2·h·E, the projections 2·2·h·ℓ, k routed experts
    2·2·ℓ·f each, the shared expert 2·2·h·5376."""
    per_token = 2 * (h * E + 2 * h * ell + k * 2 * ell * f + 2 * h * 5376)
    assert S.kind_matmul_flops_per_token("moe") == per_token == 2 * 175_636_480
    # Megatron-Core's moe recompute module re-runs all of it (recompute_modules_flops_per_token)
    from paraplan.costmodels.compute import recompute_modules_flops_per_token
    p = _plan(recompute="selective", recompute_modules="moe")
    assert float(recompute_modules_flops_per_token(S, p)) == 40 * per_token


def test_dispatch_and_all_to_all_move_latent_wide_tokens():
    """The permutation streams (4 + 8)·ℓ per routed copy (permute, regroup by local expert and back,
    unpermute: 64 experts per GPU at ep 8) + 4ℓ per token; ep 1 has no regroup: (4·22 + 4)·ℓ = 92ℓ.
    The all-to-all carries T·k copies of ℓ 16-bit values: about a quarter of the hidden-width bytes."""
    assert float(MOE.dispatch_bytes_per_token(S, JOB, _plan())) == (12 * k + 4) * ell
    assert float(MOE.dispatch_bytes_per_token(S, JOB, _plan(ep=1))) == 92 * ell
    wide = replace(S, moe=replace(S.moe, latent_size=0))
    latent, hidden = (float(MOE.ep_alltoall_time(m, JOB, _plan(), B200)) for m in (S, wide))
    assert latent / hidden == pytest.approx(ell / h, rel=0.05)      # (and the collective's latency)
    assert float(MOE.dispatch_bytes_per_token(wide, JOB, _plan())) == (12 * k + 4) * h


def test_latent_projections_are_two_gemms_on_the_tokens_of_the_rank():
    """fc1_latent_proj (T x h)·(h x ℓ) and fc2_latent_proj (T x ℓ)·(ℓ x h), duplicated over tp: T/tp tokens
    under sequence parallelism, all T without it."""
    curves = curves_for(B200)
    for p, tokens in ((_plan(), 8192), (_plan(tp=2, sp=True), 4096)):
        want = curves.gemm_time(tokens, ell, h, _dtype(p)) + curves.gemm_time(tokens, h, ell, _dtype(p))
        assert float(MOE.latent_projection_time(S, JOB, p, curves)) == pytest.approx(float(want))
    wide = replace(S, moe=replace(S.moe, latent_size=0))
    assert MOE.latent_projection_time(wide, JOB, _plan(), curves) == 0.0
    # the MoE layer's MLP: the projections in, routed GEMMs at ℓ instead of h out
    m, local, _, shapes = MOE.routed_expert_gemms(S, JOB, _plan())
    assert shapes == [(f, ell), (ell, f)]
    assert float(MOE.moe_mlp_forward_time(S, JOB, _plan(), curves)) < float(MOE.moe_mlp_forward_time(wide, JOB, _plan(), curves))


def test_saved_bytes_of_one_latent_moe_layer_by_hand():
    """One micro-batch of 8192 tokens, tp 1, no recomputation: the block's inputs 4h, the squared ReLU's
    input and output 4·f per routed copy (22) and per shared expert (2 of the routed width), the routed
    copies' FC1 input 2ℓ each (latent wide), the fp32 router logits 4E, fc2_latent_proj's input 2ℓ."""
    kinds = M.hybrid_kind_activation_bytes(S, JOB, _plan())
    per_token = 4 * h + 4 * f * (k + 2) + k * 2 * ell + 4 * E + 2 * ell
    assert float(kinds["moe"]) == 8192 * per_token
    # the moe recompute module keeps none of it
    sel = M.hybrid_kind_activation_bytes(S, JOB, _plan(recompute="selective", recompute_modules="moe"))
    assert float(sel["moe"]) == 8192 * 4 * h


def test_expert_weights_per_gpu_are_latent_wide():
    """Each GPU holds E/ep routed experts of 2·ℓ·f per E layer (pp 1: all 40 E layers)."""
    for ep in (8, 64):
        assert float(M.expert_params_per_gpu(S, _plan(ep=ep))) == pytest.approx(40 * E / ep * 2 * ell * f)
    # the projections are duplicated on every tp rank (TELinear parallel_mode="duplicated"): tp 4 holds all of them
    one, four = (float(M.stage_params(S, _plan(tp=t, sp=t > 1))[0]) for t in (1, 4))
    assert four - one / 4 == pytest.approx(40 * 2 * h * ell * (1 - 1 / 4))


def test_hugging_face_config_reads_the_latent():
    m = load_model(str(DATA / "nemotron3_super_120b_a12b_config.json"))
    assert m.moe == S.moe and m.mamba == S.mamba and m.layer_pattern == S.layer_pattern
    assert m.moe.latent_size == 1024 and m.num_params == S.num_params and m.active_params == S.active_params
    for name in ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4",
                 "Nemotron 3 Super 120B-A12B"):
        assert load_model(name).name == "nemotron3-super-120b-a12b"


def test_hybrid_mtp_of_the_released_config():
    """The released config's MTP (num_nextn_predict_layers 1, mtp_hybrid_override_pattern "*E"): one depth of an
    attention and a LatentMoE layer after the 88, with the 2h -> h projection and its two RMSNorms (Megatron-Core
    MultiTokenPredictionLayer: enorm, hnorm, eh_proj)."""
    cfg = json.loads((DATA / "nemotron3_super_120b_a12b_config.json").read_text())
    m = load_model_from(cfg, num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E")
    attention = h * (4096 + 512) + 4096 * h + h
    moe = h * E + 2 * h * ell + E * 2 * ell * f + 2 * h * 5376 + h
    depth = attention + moe + 2 * h * h + 2 * h
    assert (m.mtp_layers, m.mtp_pattern, m.mtp_params) == (1, "*E", depth) and depth == 2_942_320_640
    assert m.num_params == S.num_params + depth
    moe_active = h * E + 2 * h * ell + k * 2 * ell * f + 2 * h * 5376 + h
    assert m.active_params == S.active_params + attention + moe_active + 2 * h * h + 2 * h
    # forward FLOPs per token of the depth: projection 2·2h·h, the two layers' GEMMs, the attention layer's
    # scores over s keys (2·s·(q + o)), the shared head's logits 2·h·V
    s = 8192
    want = 4 * h * h + 2 * (h * 4608 + 4096 * h) + S.kind_matmul_flops_per_token("moe") + 2 * s * (4096 + 4096) + 2 * h * V
    assert m.mtp_flops_per_token(s) == want


def test_newer_configs_list_the_layer_kinds():
    """transformers' newer NemotronHConfig writes ``layers_block_type`` and ``mtp_layers_block_type`` lists of
    kinds in place of the pattern strings: the same model."""
    cfg = json.loads((DATA / "nemotron3_super_120b_a12b_config.json").read_text())
    kinds = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    listed = {k: v for k, v in cfg.items() if k != "hybrid_override_pattern"}
    listed["layers_block_type"] = [kinds[c] for c in cfg["hybrid_override_pattern"]]
    a = load_model_from(listed, num_nextn_predict_layers=1, mtp_layers_block_type=["attention", "moe"])
    b = load_model_from(cfg, num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E")
    assert (a.layer_pattern, a.mtp_pattern, a.num_params) == (b.layer_pattern, b.mtp_pattern, b.num_params)
    with pytest.raises(ConfigError) as e:
        load_model_from({**listed, "layers_block_type": ["ssm"] + listed["layers_block_type"][1:]})
    assert e.value.field == "layers_block_type"


def load_model_from(cfg, **extra):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "config.json"
        f.write_text(json.dumps({**cfg, **extra}))
        return load_model(str(f))


def test_repeated_mtp_depths_share_one_depth_of_parameters():
    """nemotron3-super-120b-a12b-mtp as NVIDIA's scripts train it (--mtp-num-layers 2 --mtp-use-repeated-layer
    --mtp-hybrid-override-pattern "*E"): the parameters of one depth, the compute of two; the last stage holds
    the 2 x 2 MTP layers, the depth's routed experts once."""
    from paraplan.costmodels.estimate import estimate
    from paraplan.plan import model_stage_layers
    m = load_model("nemotron3-super-120b-a12b-mtp")
    assert (m.mtp_layers, m.mtp_pattern, m.mtp_repeated, m.mtp_param_depths) == (2, "*E", True, 1)
    assert m.num_params == S.num_params + 2_942_320_640
    once = replace(m, mtp_repeated=False)
    assert once.mtp_params == 2 * m.mtp_params and once.mtp_moe_layers == 2 and m.mtp_moe_layers == 1
    assert m.mtp_flops_per_token(8192) == once.mtp_flops_per_token(8192) == 2 * replace(m, mtp_layers=1).mtp_flops_per_token(8192)
    p = _plan(pp=4, dtype="nvfp4", recompute="selective", recompute_modules="layernorm,moe_act")
    sl = model_stage_layers(m, p)
    assert (int(sl.first), int(sl.last)) == (22, 22 + 4)
    # pp 4: the last stage's experts: its share of the E layers (40/88 of 22: 10) and the one MTP depth's E layer
    # held once (4 MTP layer slots, one held E layer among them)
    assert float(M.expert_params_per_gpu(m, p)) == pytest.approx((40 / 88 * 22 + 1) * E / 8 * 2 * ell * f)
    assert float(M.expert_params_per_gpu(S, p)) == pytest.approx(40 / 88 * 22 * E / 8 * 2 * ell * f)
    base, with_mtp = (estimate(x, JOB, B200, p) for x in (S, m))
    assert with_mtp.step_time_s > base.step_time_s
    assert with_mtp.details["mtp_blocks_on_last_stage"] == 2


def test_hybrid_mtp_errors_name_the_field(tmp_path, capsys):
    cfg = json.loads((DATA / "nemotron3_super_120b_a12b_config.json").read_text())
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))      # no pattern for the depth
    with pytest.raises(ConfigError) as e:
        load_model(str(f))
    assert e.value.field == "mtp_hybrid_override_pattern"
    assert main(["estimate", "--model", str(f), "--cluster", "dgx-b200", "--gpus", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("paraplan: error: mtp_hybrid_override_pattern")
    base = ("layers: 2\nhidden: 64\nheads: 4\nvocab: 10\nmamba: {heads: 4, head_dim: 32, state: 16, groups: 1}\n"
            "moe: {experts: 8, top_k: 2, expert_ffn_hidden: 32}\n")
    for body, field in (("layer_pattern: 'ME/*E/*M'\n", "layer_pattern"), ("layer_pattern: 'ME'\nmtp_layers: 1\n", "mtp_layers"),
                        ("layer_pattern: 'ME'\nmtp_layers: 1\nmtp_pattern: '*Q'\n", "mtp_pattern"),
                        ("layer_pattern: 'ME'\nmtp_repeated: true\n", "mtp_repeated")):
        g = tmp_path / "m.yaml"
        g.write_text(base + body)
        with pytest.raises(ConfigError) as e:
            load_model(str(g))
        assert e.value.field == field, body
    # Megatron-LM's unified pattern reads into the depth count and the depth's layers
    g.write_text(base + "layer_pattern: 'ME/*E/*E'\n")
    m = load_model(str(g))
    assert (m.layer_pattern, m.mtp_pattern, m.mtp_layers) == ("ME", "*E", 2)


def test_bad_latent_size_names_the_field(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("layers: 2\nhidden: 64\nheads: 4\nvocab: 10\nlayer_pattern: 'M E'\n".replace(" E", "E")
                 + "mamba: {heads: 4, head_dim: 32, state: 16, groups: 1}\n"
                 "moe: {experts: 8, top_k: 2, expert_ffn_hidden: 32, latent_size: -1}\n")
    with pytest.raises(ConfigError) as e:
        load_model(str(f))
    assert e.value.field == "moe.latent_size"


def test_megatron_export_and_read_back(tmp_path):
    from paraplan.costmodels.estimate import estimate
    from paraplan.planfile import write_plan_file
    from paraplan.planner import export as ex
    from paraplan.planner.readers import read_megatron_script
    e = estimate(S, JOB, B200, _plan(pp=4, dtype="nvfp4", recompute="selective",
                                      recompute_modules="layernorm,moe_act"))
    f = tmp_path / "plan.json"
    write_plan_file(f, e, "nemotron3-super-120b-a12b", "dgx-b200")
    script = ex.to_megatron(json.loads(f.read_text()))
    for flag in ("--moe-latent-size 1024", "--num-experts 512", "--moe-router-topk 22", "--moe-ffn-hidden-size 2688",
                 "--moe-shared-expert-intermediate-size 5376", "--expert-model-parallel-size 8"):
        assert flag in script
    read = read_megatron_script(script)
    assert read.model["latent_size"] == 1024 and read.plan.ep == 8 and read.plan.pp == 4
    # with its MTP: Megatron-LM's unified pattern, one "/*E" per depth, and the repeated layer said
    m = load_model("nemotron3-super-120b-a12b-mtp")
    e = estimate(m, JOB, B200, _plan(pp=4, dtype="nvfp4", recompute="selective", recompute_modules="layernorm,moe_act"))
    write_plan_file(f, e, "nemotron3-super-120b-a12b-mtp", "dgx-b200")
    script = ex.to_megatron(json.loads(f.read_text()))
    assert f"--hybrid-override-pattern '{S.layer_pattern}/*E/*E'" in script and "--mtp-num-layers 2" in script
    assert "--mtp-use-repeated-layer" in script      # in the note: core_v0.16.1 has no such flag


@pytest.mark.slow
def test_plan_searches_expert_parallelism(capsys):
    assert main(["plan", "--model", "nemotron3-super-120b-a12b", "--cluster", "dgx-b200", "--gpus", "256",
                 "--seq-len", "8192", "--global-batch", "1536", "--dtype", "nvfp4", "--top", "40",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plans = doc["plans"] if isinstance(doc, dict) else doc
    eps = {p["plan"]["ep"] if "plan" in p else p["ep"] for p in plans}
    assert len(eps) > 1 and max(eps) > 1
