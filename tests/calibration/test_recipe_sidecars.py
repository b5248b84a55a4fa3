"""The published runs' recipe facts are data (paraplan/calibration/data/*.recipes.yaml): every fact
names its source and applies to a row of its file, every engine a sidecar names has its reading
defaults, the loader refuses what it does not know, and the readers' code names no engine."""
import re
from pathlib import Path

import pytest
import yaml

from paraplan.calibration import a100_recipes, h100_recipes, load_recipes, read_runs_file
from paraplan.calibration.recipes import FACT_KINDS
from paraplan.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SIDECARS = {"a100": a100_recipes, "h100": h100_recipes}


@pytest.mark.parametrize("which", sorted(SIDECARS))
def test_every_fact_has_a_source_and_applies_to_a_row_of_its_file(which):
    recipes = SIDECARS[which]()
    table = read_runs_file(recipes.csv)
    assert recipes.csv.name in {"published_runs_calibration.csv", "published_runs_calibration_h100.csv"}
    for fact in recipes.facts:
        assert len(fact.source.split()) >= 3, fact
        needs = {k: v for k, v in fact.match.items() if k not in ("engine", "preset")}
        rows = [i for i, r in table.iterrows() if fact.matches(r, fact.match.get("engine"), fact.match.get("preset"))]
        assert rows, f"{fact.kind} {needs}: matches no row of {recipes.csv.name} (stale?)"


@pytest.mark.parametrize("which", sorted(SIDECARS))
def test_sources_gpus_and_engines_are_complete(which):
    recipes = SIDECARS[which]()
    table = read_runs_file(recipes.csv)
    assert all(e.cite for e in recipes.sources if e.name)
    named = {name for _, name in recipes.engine_rules} | {e.engine for e in recipes.sources if e.engine}
    if recipes.engine_defaults:
        assert named | {recipes.default_engine, recipes.optimizer_offload_engine} <= set(recipes.engine_defaults)
    for gpu in table.gpu.unique():
        assert gpu in recipes.gpu_systems, f"{gpu!r} has no system in {recipes.path.name}"


def test_the_h100_file_facts_reach_the_cases_they_describe():
    """A fact turns into the case's plan: the 1024-H100 DeepSeek-V3 row runs DeepEP, the a2a overlap,
    no gradient-reduce overlap, its recipe's recomputed modules and an unfused RoPE; the torchtitan rows
    FlashAttention-2; and each says which sidecar it came from."""
    from paraplan.calibration import load_h100_cases
    cases = load_h100_cases()[0]
    dsv3 = next(c for c in cases if c.label.startswith("DeepSeekV3 (dropless)"))
    p = dsv3.plan
    assert (p.moe_flex_dispatch, p.ep_comm_overlap, p.overlap_grad_reduce, p.recompute_modules, p.rope_fusion) == \
        (True, True, False, "mla_up_proj,mlp", False)
    assert sum("published_runs_calibration_h100.recipes.yaml" in a for a in dsv3.assumed) >= 4
    # its recipe's layout, Et|(tt|)*30mL, holds an MTP block: the row ran multi-token prediction (the
    # archive's model FLOPs per token agree), though its name does not say so
    assert dsv3.model.mtp_layers == 1 and any("Et|(tt|)*30mL" in a and "6 on the last" in a for a in dsv3.assumed)
    mtp = next(c for c in cases if c.label.startswith("DeepSeekV3 (w/ MTP)"))
    assert (mtp.plan.first_stage_layers, mtp.plan.last_stage_layers, mtp.model.mtp_layers) == (4, 1, 1)
    titan = [c for c in cases if c.source == "torchtitan async-TP (H100)"]
    assert len(titan) == 12 and {c.plan.attention_kernel for c in titan} == {"flash2"}
    assert {c.plan.engine for c in titan} == {"torchtitan"} and {c.plan.zero for c in titan} == {3}


def test_the_gpt_oss_b200_row_runs_the_expert_parallelism_its_recipe_sets():
    """The 25.11 GPT-OSS 120B DGX-B200 row states EP 8; its recipe (and the source's 26.02 run of the
    layout at the same throughput) sets EP 64 across the eight nodes: read so, with the recipe's
    recomputed modules, and said. The other GPT-OSS rows keep the EP they state."""
    from paraplan.calibration import load_h100_cases
    cases = [c for c in load_h100_cases()[0] if c.label.startswith("GPT OSS 120B")]
    b200 = next(c for c in cases if "DGX-B200" in c.label)
    assert (b200.plan.ep, b200.plan.recompute_modules) == (64, "layernorm,moe_act")
    assert any("expert parallelism 64, not the 8 the row states" in a for a in b200.assumed)
    assert sorted(c.plan.ep for c in cases if c is not b200) == [8, 8, 64, 64]


def _write(tmp_path, doc) -> Path:
    path = tmp_path / "x.recipes.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _minimal():
    return {"file": "x.csv", "sources": [], "engines": {"source": "s t u", "rules": [], "otherwise": "generic",
                                                         "optimizer_offload": "deepspeed"},
            "gpus": {"source": "s t u", "systems": {}}, "models": {"source": "s t u", "presets": {}},
            "blank_vocab": {"value": 32000, "note": "n", "source": "s t u"}, "facts": []}


def test_the_loader_refuses_unknown_keys_kinds_columns_and_missing_sources(tmp_path):
    assert load_recipes(_write(tmp_path, _minimal())).facts == ()
    fact = {"fact": "rope_fusion", "value": False, "match": {"model": "m"}, "source": "a file, a line"}
    for bad, message in (({**fact, "source": ""}, "source"), ({**fact, "fact": "rope"}, "is not one of"),
                         ({**fact, "match": {"modle": "m"}}, "unknown column"), ({**fact, "value": "no"}, "takes a bool"),
                         ({k: v for k, v in fact.items() if k != "source"}, "missing source")):
        doc = _minimal()
        doc["facts"] = [bad]
        with pytest.raises(ConfigError, match=message):
            load_recipes.__wrapped__(_write(tmp_path, doc))
    doc = _minimal()
    doc["sources"] = [{"name": "X", "words": ["x"]}]
    with pytest.raises(ConfigError, match="cite"):
        load_recipes.__wrapped__(_write(tmp_path, doc))
    assert set(FACT_KINDS) >= {"ep_comm_overlap", "moe_flex_dispatch", "recompute_modules", "attention_kernel"}


def test_the_readers_name_no_engine():
    """Which source trained on which engine, and what an engine's rows default to, are the sidecars':
    the calibration readers' code compares and names no engine (the baseline's engine-branch grep)."""
    pattern = re.compile(r"Engine\.(GENERIC|MEGATRON|DEEPSPEED|TORCHTITAN|SCALING)|engine(_code)? ?(==|!=)|"
                         r"engine(_code)? (not )?in |\"(megatron|deepspeed|torchtitan|scaling|generic)\"")
    hits = [f"{p.name}:{i}" for p in sorted((ROOT / "paraplan" / "calibration").glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits
