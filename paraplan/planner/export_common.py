"""What every exporter shares: the scenario read from a plan document, the export record, the headline
and the launch notes (:mod:`paraplan.planner.export` writes Megatron-LM and DeepSpeed configs,
:mod:`paraplan.planner.export_torchtitan` torchtitan's)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from paraplan.engines import SPECS
from paraplan.errors import ConfigError
from paraplan.plan import Plan, check_plan
from paraplan.planfile import PLAN_SCHEMA
from paraplan.scenario import load_cluster
from paraplan.workloads.presets import load_model
from paraplan.workloads.transformer import TrainingJob

ENGINES = tuple(s.label for s in SPECS if s.export is not None)     # the engines paraplan writes configs for
RDZV_PORT = 29500
NVME_PLACEHOLDER = "/CHANGE_ME/local_nvme"     # DeepSpeed's documented default is /local_nvme
TRAIN_ITERS = 100                              # a smoke-test length; override on the command line
LEARNING_RATE = 1.0e-4


@dataclass(frozen=True)
class Scenario:
    """What an exporter needs: the checked plan (dp filled) and the job around it."""
    plan: Plan
    model: Any                      # TransformerModel
    model_spec: str
    cluster_spec: str
    cluster: Any                    # Cluster, resolved from cluster_spec for the plan's GPU count
    seq_len: int
    global_batch: int

    @property
    def gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def hosts(self) -> int:
        """Hosts the launcher starts on (torchrun --nnodes, deepspeed --num_nodes): DGX nodes, NVL72
        compute trays (``Cluster.num_hosts``), not NVLink domains."""
        return self.cluster.num_hosts

    @property
    def procs_per_host(self) -> int:
        """Ranks per host (torchrun --nproc-per-node, deepspeed --num_gpus): ``Cluster.gpus_per_host``."""
        return self.cluster.gpus_per_host

    @property
    def job(self) -> TrainingJob:
        return TrainingJob(self.seq_len, self.global_batch)

    @property
    def grad_accum(self) -> int:
        """Micro-batches per data-parallel rank per optimizer step."""
        return self.global_batch // (self.plan.dp * self.plan.micro_batch)


@dataclass
class Export:
    """Text for one engine and the notes on what it leaves to the user; ``notes_in_text``: the text
    carries them as comments (bash, Python, TOML), else the caller shows them (JSON has no comments).
    ``target``: the engine release the text is written for; ``summary``: both estimates, the plan's and
    the exported plan's (``paraplan.planner.runnable.AsRun.summary``); ``plan``: the plan written."""
    engine: str
    text: str
    notes: list[str] = field(default_factory=list)
    notes_in_text: bool = True
    target: str = ""
    summary: str = ""
    plan: Plan | None = None


# --- reading the document ---------------------------------------------------------------------------
def load_scenario(doc: Mapping[str, Any], source: str = "plan") -> Scenario:
    """Validate a plan document and resolve its model and cluster (ConfigError on any problem)."""

    if not isinstance(doc, Mapping) or doc.get("schema") != PLAN_SCHEMA:
        raise ConfigError("schema", f"not a paraplan plan document (expected schema {PLAN_SCHEMA!r})",
                          source=source)
    sc, raw_plan = doc.get("scenario"), doc.get("plan")
    for key, value in (("scenario", sc), ("plan", raw_plan)):
        if not isinstance(value, Mapping):
            raise ConfigError(key, "missing or not a mapping", source=source)
    missing = [k for k in ("model", "cluster", "gpus", "seq_len", "global_batch") if sc.get(k) in (None, "")]
    if missing:
        raise ConfigError(f"scenario.{missing[0]}", "missing", source=source,
                          accepted="scenario with model, cluster, gpus, seq_len, global_batch")
    for key in ("gpus", "seq_len", "global_batch"):
        v = sc[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"scenario.{key}", f"must be a positive integer, got {v!r}", source=source)
    model = load_model(str(sc["model"]))
    cluster = load_cluster(str(sc["cluster"]), sc["gpus"])
    plan = check_plan(Plan.from_dict(raw_plan, source=source), model,
                      TrainingJob(sc["seq_len"], sc["global_batch"]), cluster)
    return Scenario(plan=plan, model=model, model_spec=str(sc["model"]), cluster_spec=str(sc["cluster"]),
                    cluster=cluster,
                    seq_len=sc["seq_len"], global_batch=sc["global_batch"])


def _domains(s: Scenario) -> str:
    """", in NVLink domains of N GPUs" where a host is not a whole NVLink domain (NVL72), else ""."""
    c = s.cluster
    if c.system.gpus_per_host == c.system.gpus_per_node:
        return ""
    return f", in {c.num_nodes} NVLink domain(s) of {c.gpus_per_node}"


def launch_note(s: Scenario) -> str | None:
    """What the launch leaves idle: hosts started with fewer ranks than they hold GPUs, where the GPU
    count does not fill whole hosts (6 GB200: 3 ranks on each of 2 trays); None when they are full."""
    c = s.cluster
    full = min(c.num_gpus, c.system.gpus_per_host)
    if s.procs_per_host == full:
        return None
    return (f"{s.gpus} GPUs do not fill whole {c.system.gpus_per_host}-GPU hosts: the launch starts "
            f"{s.procs_per_host} ranks on each of {s.hosts} hosts (launchers start the same number on every "
            f"host), leaving {c.system.gpus_per_host - s.procs_per_host} GPU(s) of each idle")


def headline(s: Scenario) -> str:
    p = s.plan
    return (f"{s.model_spec} on {s.gpus} x {s.cluster_spec} ({s.hosts} node(s) x {s.procs_per_host} GPUs{_domains(s)}): "
            f"{p.label()}, schedule {p.schedule}, ZeRO {p.zero}, recompute {p.recompute}, offload {p.offload}"
            f"{' +params' if p.offload_params else ''}, {p.dtype}; seq {s.seq_len}, global batch {s.global_batch}")


MTP_NOTE = ("the model trains with multi-token prediction (depth as in the estimate); {engine} builds no MTP "
            "module from this config: add it in the model code, or the run trains without it (and runs faster "
            "than the estimate)")


#: the SDPA backend that pins each named attention kernel (torch.nn.attention.SDPBackend)
SDPA_BACKEND_OF_KERNEL = {"cudnn": "CUDNN_ATTENTION", "flash2": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def sdpa_kernel_note(p, engine: str) -> list[str]:
    """For engines whose attention goes through torch's scaled_dot_product_attention: how to pin the
    kernel the plan was priced with (torch otherwise picks by version and shape: 2.11 picked cuDNN
    on an H100)."""
    if not p.flash_attention or p.attention_kernel == "auto":
        return []
    if p.attention_kernel == "flash1":
        return [f"the plan was priced with FlashAttention 1.x, which torch's scaled_dot_product_attention does not "
                f"have (its flash backend is FlashAttention-2): {engine} runs it only where the model code calls "
                "the flash-attn 1.x package (flash_attn<2) itself; under SDPA expect attention faster than priced"]
    return [f"the plan was priced with the {p.attention_kernel} attention kernel; {engine} calls "
            f"torch's scaled_dot_product_attention, which picks its own backend: pin it by running the "
            f"step under torch.nn.attention.sdpa_kernel(SDPBackend.{SDPA_BACKEND_OF_KERNEL[p.attention_kernel]})"]
