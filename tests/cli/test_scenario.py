"""scenario.py: the defaults every command shares, and the cluster dispatch (preset, file, profile)."""
import pytest

from paraplan.errors import ConfigError
from paraplan.plan import Plan
from paraplan.scenario import DEFAULT_SEQ_LEN, default_global_batch, load_cluster, load_scenario


def test_defaults_of_a_request():
    sc = load_scenario("llama3-8b", "dgx-h100", gpus=16)
    assert sc.seq_len == DEFAULT_SEQ_LEN and sc.global_batch is None and sc.moe_imbalance is None  # a trained router's, priced by moe.routed_time_factor
    assert sc.job().global_batch == 16                                   # a search: one sequence per GPU
    assert sc.job(Plan(tp=2, micro_batch=4)).global_batch == 8 * 4       # a plan: one micro-batch per dp rank
    assert sc.job(Plan(tp=2, dp=2, micro_batch=4)).global_batch == 8     # dp given
    given = load_scenario("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=64, moe_imbalance=1.5)
    assert given.job(Plan(tp=2)).global_batch == 64 and given.job().seq_len == 4096
    assert given.job().moe_imbalance == 1.5


def test_default_global_batch_never_below_one_rank():
    c = load_cluster("dgx-h100", 8)
    assert default_global_batch(c, Plan(tp=8, pp=2)) == 1       # tp*pp above the GPU count: the check reports it
    assert default_global_batch(c) == 8


def test_profile_specs_go_to_the_profile_store(tmp_path):
    with pytest.raises(ConfigError, match="no profile database"):
        load_cluster("profile:nobody", 2, db=str(tmp_path / "p.sqlite"))
    with pytest.raises(ConfigError, match="no-such-system"):
        load_cluster("no-such-system", 8)
