"""The training engines, one home each: an :class:`EngineSpec` per engine (generic, megatron,
deepspeed, torchtitan, scaling) says what it holds, what it offers and refuses, how it behaves, its
defaults and how a plan is exported for it (:mod:`paraplan.engines.specs`, the facts with their
sources). Below ``paraplan.plan``, whose engine rules are generated here (:mod:`paraplan.engines.rules`);
above ``paraplan.modes``. Cost models ask :func:`engine_flag` / :func:`engine_offers` /
:func:`engine_select`, never the engine's name.

    spec.py     the types: Engine, EngineSpec, Behaviour, Switch, Refusal, ExportMapping, the holdings' records
    specs.py    SWITCHES and the five specs, each with its model-state and buffer functions
    lookup.py   SPECS by code; per-plan vectorized lookups
    rules.py    the engine rules, generated from the specs
"""
from paraplan.engines.lookup import (SWITCH_FIELDS, engine_codes, engine_flag, engine_offers, engine_select, engine_where,
                                     spec_named, spec_of)
from paraplan.engines.rules import ENGINE_RULES, EngineRule
from paraplan.engines.spec import (BEHAVIOUR_FIELDS, Behaviour, BufferArgs, Engine, EngineBuffers, EngineSpec, ExportMapping,
                                   ModelStates, Refusal, StateArgs, Switch)
from paraplan.engines.specs import (DEEPSPEED, DEEPSPEED_ALLGATHER_BUCKET, DEEPSPEED_REDUCE_BUCKET, GENERIC, MEGATRON,
                                    MEGATRON_FSDP_STRATEGY, SCALING, SCALING_LOSS_BYTES_PER_LOGIT, SPECS, SWITCHES,
                                    TORCHTITAN, main_grad_bytes)

__all__ = ["BEHAVIOUR_FIELDS", "Behaviour", "BufferArgs", "DEEPSPEED", "DEEPSPEED_ALLGATHER_BUCKET",
           "DEEPSPEED_REDUCE_BUCKET", "ENGINE_RULES", "Engine", "EngineBuffers", "EngineRule", "EngineSpec",
           "ExportMapping", "GENERIC", "MEGATRON", "MEGATRON_FSDP_STRATEGY", "ModelStates", "Refusal", "SCALING",
           "SCALING_LOSS_BYTES_PER_LOGIT", "SPECS", "SWITCHES", "SWITCH_FIELDS", "StateArgs", "Switch", "TORCHTITAN",
           "engine_codes", "engine_flag", "engine_offers", "engine_select", "engine_where", "main_grad_bytes",
           "spec_named", "spec_of"]
