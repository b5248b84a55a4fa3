"""Interleaved chunks of uneven size: Megatron-Core's --pipeline-model-parallel-layout and torchtitan's
split points take any split; the other engines keep Megatron-LM's embedding / loss accounting."""
import pytest

from paraplan.errors import ConfigError
from paraplan.hardware.catalog import load_cluster
from paraplan.plan import Plan, check_plan, interleaved_split_accounts, stage_layer_counts, virtual_stage_layer_counts
from paraplan.planfile import PLAN_SCHEMA
from paraplan.planner import export as ex
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob


def test_chunks_split_evenly_with_lighter_ends_and_match_the_accounting_where_it_applies():
    counts = virtual_stage_layer_counts(61, Plan(pp=8, vpp=4, schedule="interleaved"))
    assert len(counts) == 32 and sum(counts) == 61 and set(counts) == {1, 2}
    assert counts[0] == counts[-1] == 1                        # embedding and loss chunks lighter
    # per physical stage (chunk i on stage i mod pp) the same totals as the pp-only split
    stages = [sum(counts[i::8]) for i in range(8)]
    assert sorted(stages) == sorted(stage_layer_counts(61, Plan(pp=8)))
    # where --account-for-embedding/loss makes the layers divide, the same chunks as that accounting
    for layers, pp, vpp in ((126, 8, 8), (127, 8, 8), (128, 8, 8), (94, 8, 4)):
        emb, loss = interleaved_split_accounts(layers, pp, vpp)
        c = (layers + emb + loss) // (pp * vpp)
        assert virtual_stage_layer_counts(layers, Plan(pp=pp, vpp=vpp, schedule="interleaved")) == \
            [c - emb] + [c] * (pp * vpp - 2) + [c - loss]


def test_uneven_chunks_are_legal_on_every_engine_that_interleaves():
    """61 layers divide into no pp*vpp (nor +1, +2): Megatron-Core's layout, torchtitan's split points and
    the generic engine take uneven chunks, so a DeepSeek-V3 plan on the generic engine can choose interleaved beside
    the zero-bubble and DualPipe schedules."""
    model, job, cluster = load_model("deepseek-v3"), TrainingJob(4096, 4096), load_cluster("dgx-h100", 1024)
    kw = dict(tp=2, pp=8, dp=64, sp=True, ep=64, vpp=4, schedule="interleaved", zero=1)
    check_plan(Plan(engine="megatron", **kw), model, job, cluster)
    check_plan(Plan(engine="generic", **dict(kw, ep=8)), model, job, cluster)
    check_plan(Plan(engine="torchtitan", **dict(kw, zero=2)), model, job, cluster)
    # one layer per chunk is still the floor: 61 layers on pp 16 x vpp 4 = 64 chunks
    with pytest.raises(ConfigError) as e:
        check_plan(Plan(engine="generic", **dict(kw, ep=8, pp=16, dp=32)), model, job, cluster)
    assert "layers(61) < pp(16) * vpp(4)" in str(e.value)


def test_megatron_export_spells_out_the_layout():
    doc = {"schema": PLAN_SCHEMA,
           "scenario": {"model": "deepseek-v3", "cluster": "dgx-b200", "gpus": 1024, "seq_len": 4096,
                        "global_batch": 4096},
           "plan": {"tp": 2, "pp": 8, "dp": 64, "sp": True, "ep": 64, "vpp": 4, "schedule": "interleaved",
                    "zero": 1, "engine": "megatron", "recompute": "full"}, "estimate": {}}
    text = ex.to_megatron(doc)
    layout = text.split("--pipeline-model-parallel-layout ")[1].split()[0].strip("'\"")
    chunks = layout.split("|")
    assert len(chunks) == 32 and chunks[0].startswith("E") and chunks[-1].endswith("L")
    layers = sum(int(c.split("t*")[1].split(",")[0]) if "t*" in c else c.count("t") for c in chunks)
    assert layers == 61
    assert "--num-layers-per-virtual-pipeline-stage" not in text        # the layout says it
    # an evenly divisible interleaved plan keeps the plain flag
    even = dict(doc, scenario=dict(doc["scenario"], model="llama3-70b", cluster="dgx-h100", gpus=64, global_batch=256),
                plan={"tp": 4, "pp": 4, "dp": 4, "vpp": 2, "schedule": "interleaved", "zero": 1, "engine": "megatron",
                      "recompute": "full", "sp": True})
    text = ex.to_megatron(even)
    assert "--num-layers-per-virtual-pipeline-stage 10" in text and "layout" not in text


def test_megatron_layout_is_read_as_megatron_core_reads_it():
    """Megatron-Core's layout grammar (pipeline_parallel_layer_layout.py, parse_str_to_list): "(...)*n"
    and "x*n" written out, chunks at "|", chunk i on rank i mod pp; per rank its layers and MTP blocks."""
    from paraplan.plan import read_megatron_layout
    # Megatron-Bridge's 1024-H100 DeepSeek-V3 layout: 32 chunks on pp 8, the MTP block and loss alone last
    h100 = read_megatron_layout("Et|(tt|)*30mL", 8)
    assert h100.vpp == 4 and h100.layers == (7, 8, 8, 8, 8, 8, 8, 6) and h100.mtp == (0,) * 7 + (1,)
    # its recipe's pp 16 layout: the embedding and 4 layers first, 1 layer with the MTP block and loss last
    b200 = read_megatron_layout("Et*4|(t*4|)*14tmL", 16)
    assert b200.vpp == 1 and b200.layers == (4,) * 15 + (1,) and sum(b200.mtp) == 1 == b200.mtp[-1]
    # the docs' example, commas cosmetic: 32 chunks on pp 16 are vpp 2, the MTP chunk on rank 14
    docs = read_megatron_layout("Et*3|(tt|)*29,m|L", 16)
    assert docs.vpp == 2 and sum(docs.layers) == 61 and docs.mtp[14] == 1
    for bad, pp in (("Et|tt|tL", 2), ("Ex|tL", 2)):
        with pytest.raises(ConfigError) as e:
            read_megatron_layout(bad, pp)
        assert e.value.field == "pipeline_layout"


def test_megatron_args_read_an_interleaved_layout_as_interleaved():
    """A layout with "(tt|)*30" is 32 chunks: read before as one stage per chunk group (vpp 1, 1 layer on the
    first stage, 0 on the last), it is vpp 4 with the ranks' layers said as not expressed."""
    from paraplan.planner.readers import read_megatron_args
    base = ["--num-layers", "61", "--hidden-size", "7168", "--num-attention-heads", "128",
            "--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "64", "--num-experts", "256",
            "--sequence-parallel", "--pipeline-model-parallel-size"]
    read = read_megatron_args(base + ["8", "--pipeline-model-parallel-layout", "Et|(tt|)*30mL"])
    assert (read.plan.vpp, read.plan.first_stage_layers, read.plan.last_stage_layers) == (4, 0, 0)
    assert any("[7, 8, 8, 8, 8, 8, 8, 6]" in u for u in read.unexpressed)
    read = read_megatron_args(base + ["16", "--pipeline-model-parallel-layout", "Et*4|(t*4|)*14tmL"])
    assert (read.plan.vpp, read.plan.first_stage_layers, read.plan.last_stage_layers) == (1, 4, 1)
