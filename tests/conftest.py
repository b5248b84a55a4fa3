import pytest

from paraplan.hardware.catalog import load_cluster
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob, TransformerModel


def gpt(h=4096, a=32, L=24, V=51200, **kw):
    """A GPT-layout model (MHA, 4h GELU MLP, tied embeddings, unfused-attention friendly)."""
    return TransformerModel(name="gpt-test", layers=L, hidden=h, heads=a, vocab=V, tied_embeddings=True, **kw)


@pytest.fixture
def a100_64():
    return load_cluster("dgx-a100-80g", 64)


@pytest.fixture
def llama70b():
    return load_model("llama3-70b")


@pytest.fixture
def job():
    return TrainingJob(seq_len=2048, global_batch=512)
