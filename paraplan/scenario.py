"""A scenario: what is trained (model), how (job: sequence, batch), and where (cluster), loaded
once with every default in one place. The commands, the what-if sweeps and the validation
harness build their model, job and cluster here.

A cluster spec is a system preset, a cluster YAML file (:func:`paraplan.hardware.catalog.load_cluster`),
or a measured profile: ``local`` (this machine) or ``profile:NAME`` in the profile database
(:func:`paraplan.profiles.cluster.load_profiled_cluster`; no torch needed to read one).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from paraplan.constants import fitted
from paraplan.hardware import catalog
from paraplan.hardware.model import Cluster
from paraplan.plan import Plan
from paraplan.profiles.cluster import is_profile_spec, load_profiled_cluster
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob, TransformerModel

DEFAULT_SEQ_LEN = 2048
#: None: a trained router's imbalance, as the MoE cost model prices it (moe.routed_time_factor)
DEFAULT_MOE_IMBALANCE = None
#: The engine ``plan``, ``estimate`` and ``whatif`` plan and price for when neither ``--engine`` nor a plan
#: file names one: Megatron-LM, the most common stack for GPU LLM training (NeMo and Megatron-Bridge build on
#: it; most of the published runs paraplan calibrates on ran it). A plan file records its engine, so a plan
#: keeps the engine it was planned for. ``Plan()`` in Python keeps the ``generic`` engine (the ZeRO paper's
#: accounting, no engine's restrictions), as do ``validate`` (its harness is plain PyTorch) and old plan files.
DEFAULT_ENGINE = "megatron"
#: The share of each GPU's memory a plan may use, on ``plan`` and ``whatif`` alike (--max-memory-fraction,
#: a what-if scenario file's max_memory_fraction): all of it (the estimate's total holds the caching
#: allocator's reserve and fragmentation and the runtime reserve already); plans that churn the allocator
#: (ZeRO-3 / FSDP) keep 2 GiB free besides (paraplan.costmodels.memory.planner_memory_limit). Chosen on the
#: Hagemann et al. 2023 sweep (benchmarks/sweep_memory_picks.py, 259 OOM / 263 ran, A100-80GB): the share at
#: most 1 that minimizes the larger of the false-fit and false-OOM rates (1.00: 4.2 % / 4.9 %; 0.97: 3.1 / 6.8;
#: 0.95: 3.1 / 8.0), and the one at which the planner's pick among each sheet's layouts is within 5 % of the
#: best measured run on 5 of 5 sheets (0.95: 2 of 5; the sweep's fastest runs are memory-tight).
DEFAULT_MEMORY_FRACTION = fitted("plan_memory_fraction")


def load_cluster(spec: str, gpus: int | None = None, *, inter_node_oversubscription: float = 1.0,
                 db: str | None = None) -> Cluster:
    """A cluster from a preset, a YAML file, ``local`` or ``profile:NAME`` (``db``: the profile
    database, default ``$PARAPLAN_PROFILE_DB`` or the cache)."""
    if is_profile_spec(spec):
        return load_profiled_cluster(spec, gpus, db)
    return catalog.load_cluster(spec, gpus, inter_node_oversubscription=inter_node_oversubscription)


def default_global_batch(cluster: Cluster, plan: Plan | None = None) -> int:
    """The global batch when the user gives none: one micro-batch per data-parallel rank of a
    given plan (dp = what the GPU count leaves when the plan does not say), else one sequence per
    GPU (what a search ranks plans for)."""
    if plan is None:
        return cluster.num_gpus
    dp = plan.dp or max(1, cluster.num_gpus // plan.model_parallel)
    return dp * plan.micro_batch


@dataclass(frozen=True)
class Scenario:
    """The model, the cluster and the job a request names; the global batch follows from the plan
    (``estimate``) or from the cluster (``plan``) when the user gave none."""
    model: TransformerModel
    cluster: Cluster
    seq_len: int = DEFAULT_SEQ_LEN
    global_batch: int | None = None
    moe_imbalance: float | None = DEFAULT_MOE_IMBALANCE

    def job(self, plan: Plan | None = None) -> TrainingJob:
        """The training job for one plan, or (plan None) the job a search ranks plans for."""
        return TrainingJob(self.seq_len, self.global_batch or default_global_batch(self.cluster, plan),
                           moe_imbalance=self.moe_imbalance)

    def with_cluster(self, cluster: Cluster) -> "Scenario":
        """The same request on another cluster (e.g. placed on a modelled fabric)."""
        return replace(self, cluster=cluster)


def load_scenario(model: str, cluster: str, *, gpus: int | None = None, seq_len: int | None = None,
                  global_batch: int | None = None, moe_imbalance: float | None = None,
                  db: str | None = None) -> Scenario:
    """Load a model spec (preset, YAML/JSON file, Hugging Face config.json) and a cluster spec;
    unset values take the defaults above."""
    return Scenario(model=load_model(model), cluster=load_cluster(cluster, gpus, db=db),
                    seq_len=seq_len or DEFAULT_SEQ_LEN, global_batch=global_batch,
                    moe_imbalance=DEFAULT_MOE_IMBALANCE if moe_imbalance is None else moe_imbalance)
