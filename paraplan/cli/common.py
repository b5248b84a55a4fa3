"""Flags and helpers every command shares: scenario and plan flags, turning them into objects, and
running a command so that a user's error prints one line and exits 2.

The plan flags are generated from the fields of :class:`paraplan.plan.Plan`, so a field and its
flag cannot drift apart, and each flag means the same on every command that has it.
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import math
import os
import re
import sys
import textwrap
from dataclasses import Field, fields
from pathlib import Path

from paraplan.constants import fitted
from paraplan.errors import ConfigError, ParaplanError, printable, shown
from paraplan.io import parse_size, path_problem
from paraplan.plan import (CHOICE, COUNT, CP_MODES, DERIVED, LAYERS, MODE, MODULES, PLAN_FIELD_SPECS, SWITCH, Plan,
                           attribute_docstrings)
from paraplan.planfile import read_plan_file
from paraplan.scenario import DEFAULT_ENGINE, DEFAULT_MEMORY_FRACTION, DEFAULT_SEQ_LEN, Scenario, load_scenario


# Counts beyond a C int are refused where they are read (2^31 GPUs, layers, batches ... are never
# meant; numpy and the solvers overflow or walk for minutes on them).
MAX_COUNT = 2**31 - 1


def _integer(name: str, text: str, low: int, high: int, what: str, sizes: bool = False) -> int:
    try:
        if not sizes:
            v = int(text.strip())
        else:   # 8k = 8192, 1M = 1024^2 (paraplan.io.parse_size); an integral count, within a double's range
            f = parse_size(text)
            if not (math.isfinite(f) and f == int(f)):
                raise ValueError(text)
            v = int(f)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{name} must be {what}, got {shown(text)}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"{name} must be {what}, got {shown(text)}")
    if v > high:
        raise argparse.ArgumentTypeError(f"{name} must be at most {high:,}, got {shown(text)}")
    return v


def positive_int(name: str, maximum: int = MAX_COUNT, *, sizes: bool = False):
    """An argparse type that accepts integers 1..maximum and names the flag in its error; with ``sizes``
    also a size suffix (``8k`` = 8192, ``1M`` = 1024^2: :func:`paraplan.io.parse_size`, as whatif's
    ``--sweep`` reads them)."""
    what = "a positive integer" + (" (k = 1024, M = 1024^2 accepted: 8k)" if sizes else "")

    def parse(text: str) -> int:
        return _integer(name, text, 1, maximum, what, sizes)
    return parse


def non_negative_int(name: str, maximum: int = MAX_COUNT, zero_means: str = "automatic"):
    """An argparse type that accepts integers 0..maximum (0: ``zero_means``) and names the flag."""
    def parse(text: str) -> int:
        return _integer(name, text, 0, maximum, f"a positive integer or 0 ({zero_means})")
    return parse


def number(name: str, *, low: float | None = 0.0, high: float | None = None, low_open: bool = True):
    """An argparse type for a finite number in (low, high] (``low_open=False``: [low, high]); the
    error names the flag and the range. NaN, inf and numbers past a double are refused."""
    span = (f"{'>' if low_open else '>='} {low:g}" if low is not None else "") + \
        (" and " if low is not None and high is not None else "") + (f"<= {high:g}" if high is not None else "")

    def parse(text: str) -> float:
        try:
            v = float(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{name} must be a number {span}, got {shown(text)}") from None
        if not math.isfinite(v) or (low is not None and (v <= low if low_open else v < low)) or \
                (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number {span}, got {shown(text)}")
        return v
    return parse


NAME_MAX_BYTES = 255     # one path component, on every common file system


def _too_long_part(path: str) -> str | None:
    return next((part for part in Path(path).parts if len(os.fsencode(part)) > NAME_MAX_BYTES), None)


def check_out_path(flag: str, path: str, *, folder: bool) -> None:
    """Refuse an output path that cannot be written, before any work: empty, a name over 255 bytes, a
    folder where a file goes (or a file where a folder goes), or under a file. ConfigError naming ``flag``."""
    if not path or not path.strip():
        raise ConfigError(flag, "empty path", accepted="a file name" if not folder else "a folder name")
    if path_problem(path):
        raise ConfigError(flag, path_problem(path))
    long_part = _too_long_part(path)
    if long_part:
        raise ConfigError(flag, f"a name in the path is {len(os.fsencode(long_part))} bytes long",
                          accepted=f"names of at most {NAME_MAX_BYTES} bytes")
    p = Path(path)
    if p.exists():
        if folder and not p.is_dir():
            raise ConfigError(flag, f"{path} is a file, not a folder", accepted="a folder (new or existing)")
        if not folder and p.is_dir():
            raise ConfigError(flag, f"{path} is a folder", accepted="a file name")
    for parent in p.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(flag, f"{parent} is a file, so {path} cannot be created under it")
            break


def check_in_path(flag: str, path: str) -> None:
    """Refuse an input path that is empty, too long, missing or a folder. ConfigError naming ``flag``."""
    if not path or not path.strip():
        raise ConfigError(flag, "empty path", accepted="an existing file")
    if path_problem(path):
        raise ConfigError(flag, path_problem(path))
    long_part = _too_long_part(path)
    if long_part:
        raise ConfigError(flag, f"a name in the path is {len(os.fsencode(long_part))} bytes long",
                          accepted=f"names of at most {NAME_MAX_BYTES} bytes")
    if os.path.isdir(path):
        raise ConfigError(flag, f"{path} is a folder", accepted="a file")


@contextlib.contextmanager
def writing(flag: str, path: str):
    """Turn an OSError while writing ``path`` (read-only place, disk full, name too long) into a
    ConfigError naming ``flag``; nothing half-written stays (the writers are atomic)."""
    try:
        yield
    except OSError as e:
        raise ConfigError(flag, f"cannot write {path}: {e.strerror or e}") from None


#: the longest line the commands print as text (longer ones wrap, their continuation indented)
LINE_WIDTH = 120


def wrap_lines(text: str, width: int = LINE_WIDTH) -> str:
    """Each line of ``text`` longer than ``width`` wrapped at spaces, its continuations indented past the line's
    own indent (two spaces past a list item's "- ", four otherwise); a word longer than the width stays whole."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())]
        more = lead + ("  " if line.lstrip().startswith("- ") else "    ")
        if " · " in line:     # a plan line: break between its items, never inside one ("(fp8 parameters)")
            out.extend(_pack(line.split(" · "), " · ", width, more))
            continue
        out.extend(textwrap.wrap(line, width=width, initial_indent="", subsequent_indent=more,
                                 break_long_words=False, break_on_hyphens=False, drop_whitespace=True)
                   if line.strip() else [line])
    return "\n".join(out)


def _pack(items: list[str], sep: str, width: int, indent: str) -> list[str]:
    """``items`` joined by ``sep`` into lines of at most ``width`` (an item longer than that alone on its line),
    each line after the first starting with ``indent`` and the separator."""
    lines: list[str] = []
    current = items[0]
    for item in items[1:]:
        if len(current) + len(sep) + len(item) <= width:
            current += sep + item
        else:
            lines.append(current)
            current = indent + sep.lstrip() + item
    return lines + [current]


class ParaplanArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: the flag, the problem, the accepted values and a did-you-mean
    for a mistyped flag or choice, then where to look (``--help``), instead of the whole usage."""

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        if message.startswith("the following arguments are required"):
            # argparse checks required flags before it reports unknown ones: a mistyped required
            # flag is better reported as the typo it is
            known = {o for a in self._actions for o in a.option_strings}
            typos = [w for w in getattr(self, "_given", ()) if w.startswith("--") and w.split("=")[0] not in known
                     and not any(k.startswith(w.split("=")[0]) for k in known)]
            if typos:
                message = f"unrecognized arguments: {typos[0]}"
        print(f"{self.prog}: error: {printable(friendly_parse_error(message, self))}", file=sys.stderr)
        print(f"(see: {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _is_plan_field(flag: str) -> bool:
    """Whether ``--flag`` names a field of a plan (an axis ``plan --fix`` pins)."""
    from dataclasses import fields

    from paraplan.plan import Plan
    return flag.lstrip("-").replace("-", "_") in {f.name for f in fields(Plan)}


def _did_you_mean(word: str, known) -> str:
    close = difflib.get_close_matches(word, list(known), n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _all_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of a parser and its subcommands (the top level reports a subcommand's
    unknown flags, so its did-you-mean looks there too)."""
    out = set()
    for a in parser._actions:
        out.update(a.option_strings)
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                out |= _all_options(sub)
    return out


#: commands that search layouts (they pin an axis with --fix instead of taking it as a flag)
SEARCH_COMMANDS = ("plan", "whatif")
#: a flag of one command and the spelling another command gives the same thing
OTHER_SPELLINGS = {"--sp": "--sequence-parallel", "--vpp": "--virtual-stages", "--sequence-parallel": "--sp",
                   "--virtual-stages": "--vpp"}


def _subparser_given(parser: argparse.ArgumentParser, words) -> tuple[str | None, argparse.ArgumentParser | None]:
    """(the top-level subcommand named in ``words``, its parser); (None, None) without one."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for w in words:
                if w in a.choices:
                    return w, a.choices[w]
    return None, None


def _subcommand_given(parser: argparse.ArgumentParser, words) -> tuple[str | None, set[str]]:
    """(the top-level subcommand named in ``words``, its option strings); (None, set()) without one."""
    command, sub = _subparser_given(parser, words)
    return command, ({o for x in sub._actions for o in x.option_strings} if sub else set())


def _positionals_given(parser: argparse.ArgumentParser, words) -> list[str]:
    """The metavars of the positional arguments of the subcommand named in ``words`` (e.g. ['RUNS.csv'])."""
    _, sub = _subparser_given(parser, words)
    return [x.metavar or x.dest for x in sub._actions
            if not x.option_strings and not isinstance(x, argparse._SubParsersAction)] if sub else []


def friendly_parse_error(message: str, parser: argparse.ArgumentParser) -> str:
    """argparse's error message as one line that starts with the flag it is about."""
    m = re.match(r"argument (\S+?): invalid choice: (.*?) \(choose from (.*)\)$", message, re.S)
    if m:
        flag, value, choices = m.groups()
        names = [c.strip().strip("'") for c in choices.split(",")]
        flag = flag.split("/")[0]
        if flag.startswith("{"):        # a subcommand shown by its metavar
            flag = "command"
        return (f"{flag}: unknown value {shown(value.strip(chr(39)))}{_did_you_mean(value.strip(chr(39)), names)}"
                f" (accepted: {', '.join(names)})")
    m = re.match(r"unrecognized arguments: (.*)$", message, re.S)
    if m:
        words = m.group(1).split()
        flags = [w for w in words if w.startswith("-")]
        word = (flags or words)[0]
        known = _all_options(parser)
        flag = word.split('=')[0]
        if flag in known:   # a flag of another subcommand (e.g. estimate's --pp given to plan)
            command, own = _subcommand_given(parser, getattr(parser, "_given", ()))
            alias = OTHER_SPELLINGS.get(flag)
            if alias in own:
                hint = f"; {command} spells it {alias}"
            elif command in SEARCH_COMMANDS and _is_plan_field(flag):
                hint = "; the search pins an axis with --fix AXIS=VALUE (e.g. --fix pp=2)"
            else:
                hint = ""
            return f"{shown(flag, 60).strip(chr(39))}: not a flag of this command{hint}"
        positionals = _positionals_given(parser, getattr(parser, "_given", ()))
        # a value read as a flag: argparse takes '-1e309' (or '-inf', '-nan') for one
        if re.match(r"-([\d.]|inf|nan)", flag, re.I) and positionals:
            where = " or ".join(str(p) for p in positionals)
            return (f"{shown(word, 60).strip(chr(39))}: read as a flag because it starts with '-', not as {where}; "
                    f"a file of that name goes as ./{word}")
        alias = OTHER_SPELLINGS.get(flag)
        suggestion = f"; this command spells it {alias}" if alias in known else _did_you_mean(flag, known)
        return f"{shown(flag, 60).strip(chr(39))}: unrecognized argument{suggestion}"
    m = re.match(r"argument (\S+): (.*)$", message, re.S)
    if m:
        flag, rest = m.groups()
        flag = flag.split("/")[0]
        if rest.startswith(flag):
            return rest
        return f"{flag}: {rest}"
    m = re.match(r"the following arguments are required: (.*)$", message, re.S)
    if m:
        return f"{m.group(1)}: required"
    m = re.match(r"ambiguous option: (\S+?)(=\S*)? could match (.*)$", message, re.S)
    if m:
        return f"{m.group(1)}: ambiguous option (could be {m.group(3)})"
    return message


def add_scenario_args(ap: argparse.ArgumentParser, *, require: bool = True) -> None:
    """--model, --cluster and what else pins the model, the job and the cluster."""
    ap.add_argument("--model", required=require, help="preset name, model YAML/JSON file, or a Hugging Face config.json")
    ap.add_argument("--cluster", required=require, help="system preset (e.g. dgx-a100-80g), a cluster YAML file, "
                    "'local' (this machine's measured profile) or 'profile:NAME' (fingerprint id or hostname)")
    ap.add_argument("--db", default=None, help="profile database for --cluster local/profile:NAME "
                    "(default $PARAPLAN_PROFILE_DB or ~/.cache/paraplan/profiles.sqlite)")
    ap.add_argument("--gpus", type=positive_int("--gpus", sizes=True),
                    help="GPU count (default: one node, or the file's); 1k = 1024")
    ap.add_argument("--seq-len", type=positive_int("--seq-len", sizes=True), default=None,
                    help=f"tokens per sequence (default {DEFAULT_SEQ_LEN}); 8k = 8192, 128k, 1M = 1024^2")
    ap.add_argument("--global-batch", type=positive_int("--global-batch", sizes=True), default=None,
                    help="sequences per optimizer step (default: 1 per data-parallel rank x micro-batch); 1k = 1024")
    ap.add_argument("--moe-imbalance", type=number("--moe-imbalance", low=1.0, high=1e6, low_open=False), default=None,
                    help="busiest expert-parallel rank's routed tokens over the mean (1.0 = balanced, e.g. a router "
                    f"forced to balance; default: a trained router's {fitted('moe_routed_rank_imbalance'):g} with --ep > 1, "
                    "measured by FEPLB, arXiv:2604.19654)")
    ap.add_argument("--network", choices=("rail", "flat"), default=None,
                    help="place groups on a networkx model of the fabric: rail-optimized or flat leaves")
    ap.add_argument("--oversubscription", type=number("--oversubscription", low=1.0, high=1e6, low_open=False),
                    default=None,
                    help="leaf-to-spine oversubscription of the fabric (e.g. 2 for 2:1); implies --network rail")


# Plan fields without a flag of their own, and the flag that sets them instead (none: every field has its
# generated flag; cp_mode's is --cp-mode, with --sp-mode kept as a deprecated alias, DEPRECATED_SP_MODE).
PLAN_FIELDS_WITHOUT_FLAG: dict[str, str] = {}
#: --sp-mode, the name --cp-mode and --sp had on estimate before issue 67: still read, with a note on stderr
DEPRECATED_SP_MODE = ("deprecated alias, kept for old scripts: --sp-mode megatron is --sp, --sp-mode ring|ulysses "
                      "is --cp-mode ring|ulysses")
# Plan fields whose flag, given without any other plan flag, constrains a search (plan, whatif)
# instead of fixing a whole plan to re-estimate.
SEARCH_CONSTRAINT_FLAGS = ("grad_accumulation_fusion", "engine", "dtype", "attention_kernel")


def _plan_fields() -> list[Field]:
    """The Plan fields that have a flag of their own, in declaration order."""
    return [f for f in fields(Plan) if f.name not in PLAN_FIELDS_WITHOUT_FLAG]


PLAN_FLAGS = tuple(f.name for f in _plan_fields())
#: what --engine's help adds to the field's docstring: the commands' default
ENGINE_DEFAULT_HELP = (f" Default: {DEFAULT_ENGINE} (or the engine a --plan file names); validate, whose harness is "
                       "plain PyTorch, prices generic.")
# Accepted values of the categorical plan fields that have a flag (the flag's argparse choices)
PLAN_FLAG_CHOICES = {name: (s.mode.labels() if s.kind == MODE else s.choices) for name, s in PLAN_FIELD_SPECS.items()
                     if s.kind in (MODE, CHOICE) and name not in PLAN_FIELDS_WITHOUT_FLAG}


def plan_flag_help(name: str) -> str:
    """A Plan field's flag help: the field's docstring (:func:`paraplan.plan.attribute_docstrings`),
    on one line, with argparse's ``%`` escaped."""
    return " ".join(attribute_docstrings(Plan).get(name, "").split()).replace("%", "%%")


def plan_flag_kwargs(f: Field) -> tuple[str, dict]:
    """The option string and add_argument keywords of one Plan field's flag, from the field's kind
    (:data:`paraplan.plan.PLAN_FIELD_SPECS`) and its docstring (the help).

    Every flag defaults to None ("not given"), so a plan file or the Plan default fills it.
    """
    spec = PLAN_FIELD_SPECS[f.name]
    flag = "--" + f.name.replace("_", "-")
    kw: dict = {"dest": f.name, "default": None, "help": plan_flag_help(f.name)}
    if spec.kind == SWITCH:
        if spec.default:
            kw["help"] += " On by default; this flag turns it off."
            return "--no-" + flag[2:], {**kw, "action": "store_false"}
        return flag, {**kw, "action": "store_true"}
    if spec.kind == MODE:
        if f.name == "engine":     # the commands' default, not Plan()'s (paraplan.scenario.DEFAULT_ENGINE)
            kw["help"] += ENGINE_DEFAULT_HELP
        return flag, {**kw, "choices": spec.mode.labels()}
    if spec.kind == CHOICE:
        return flag, {**kw, "choices": spec.choices, "type": int}
    if spec.kind == MODULES:
        return flag, {**kw, "metavar": spec.metavar}
    if spec.kind == LAYERS:
        return flag, {**kw, "type": non_negative_int(flag, zero_means=spec.zero_means)}
    if spec.kind in (COUNT, DERIVED):       # DERIVED (dp): leaving the flag out is what its 0 means
        return flag, {**kw, "type": positive_int(flag)}
    raise TypeError(f"Plan.{f.name}: no flag for a field of kind {spec.kind}")


def plan_change_flags(change) -> str:
    """The flags that make a plan change (plan field -> value pairs), as ``estimate`` spells them: a switch
    by its ``--name`` / ``--no-name`` form, any other field as ``--name VALUE`` (:func:`plan_flag_kwargs`)."""
    out = []
    for name, value in change:
        flag = "--" + name.replace("_", "-")
        if PLAN_FIELD_SPECS[name].kind == SWITCH:
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out.append(f"{flag} {value}")
    return " ".join(out)


def add_plan_args(ap: argparse.ArgumentParser) -> None:
    """``--plan FILE``, one flag per Plan field, and the deprecated ``--sp-mode`` alias."""
    g = ap.add_argument_group("plan")
    g.add_argument("--plan", help="a plan file written by `paraplan plan --out` (flags below override it)")
    for f in _plan_fields():
        flag, kw = plan_flag_kwargs(f)
        g.add_argument(flag, **kw)
    g.add_argument("--sp-mode", choices=("megatron", *CP_MODES), help=DEPRECATED_SP_MODE)


def add_search_args(ap: argparse.ArgumentParser, *, max_memory_fraction: float | None = DEFAULT_MEMORY_FRACTION) -> None:
    """The search options ``plan`` and ``whatif`` share: --fix, --no-offload, --max-memory-fraction (one default
    for both, :data:`paraplan.scenario.DEFAULT_MEMORY_FRACTION`; whatif passes None so that a --scenario file's
    value stands unless the flag is given)."""
    ap.add_argument("--fix", action="append", metavar="AXIS=VALUE", help="pin an axis or mode of the search "
                    "(at every point, for whatif), by name: any plan field, e.g. tp=8, zero=1, "
                    "schedule=interleaved, recompute=selective, optimizer=adam, cp_mode=ulysses, dtype=bf16, "
                    "flash_attention=false")
    ap.add_argument("--no-offload", action="store_true", help="do not consider CPU/NVMe offload")
    ap.add_argument("--max-memory-fraction", type=number("--max-memory-fraction", low=0.01, high=1.0, low_open=False),
                    default=max_memory_fraction,
                    help=f"use at most this share of each GPU's memory (default {DEFAULT_MEMORY_FRACTION:g}, on plan "
                         "and whatif alike, or a whatif --scenario file's max_memory_fraction)")


def add_plan_flag(ap, name: str) -> None:
    """Just one Plan field's flag, defined as add_plan_args defines it (same dest, same meaning)."""
    flag, kw = plan_flag_kwargs(next(f for f in _plan_fields() if f.name == name))
    ap.add_argument(flag, **kw)


def plan_flags_given(args, *, search_constraints: bool = True) -> bool:
    """Whether ``--plan`` or any plan flag was given; ``search_constraints=False`` leaves out the
    flags that also make sense as a constraint on a search (SEARCH_CONSTRAINT_FLAGS)."""
    names = [k for k in PLAN_FLAGS if search_constraints or k not in SEARCH_CONSTRAINT_FLAGS]
    return bool(getattr(args, "plan", None)) or getattr(args, "sp_mode", None) is not None or any(
        getattr(args, k, None) is not None for k in names)


def scenario_defaults_from_plan_file(args, keys=("model", "cluster", "gpus", "seq_len", "global_batch")) -> None:
    """With ``--plan FILE``, take each scenario value not given as a flag from the file's scenario (the
    model, cluster, GPUs, sequence and batch it was planned for)."""
    if not getattr(args, "plan", None):
        return
    scenario = read_plan_file(args.plan)["scenario"]
    for key in keys:
        if getattr(args, key, None) is None:
            setattr(args, key, scenario.get(key))


def sp_mode_fields(args) -> dict:
    """The plan fields the deprecated ``--sp-mode`` sets (``{"sp": True}`` or ``{"cp_mode": ...}``), with a
    note on stderr naming today's flag; ConfigError where it contradicts ``--cp-mode``."""
    mode = getattr(args, "sp_mode", None)
    if mode is None:
        return {}
    now = "--sp" if mode == "megatron" else f"--cp-mode {mode}"
    print(f"paraplan: note: --sp-mode is deprecated; use {now}", file=sys.stderr)
    if mode == "megatron":
        return {"sp": True}
    given = getattr(args, "cp_mode", None)
    if given is not None and given != mode:
        raise ConfigError("--sp-mode", f"{mode} contradicts --cp-mode {given}", accepted="--cp-mode alone")
    return {"cp_mode": mode}


def plan_from_args(args, default_engine: str | None = DEFAULT_ENGINE) -> Plan:
    """The plan the flags describe: ``--plan FILE`` if given, each given flag overriding it. Where neither
    names an engine, ``default_engine`` (the commands' :data:`paraplan.scenario.DEFAULT_ENGINE`; None: the
    Plan default, generic, as validate's plain-PyTorch harness runs it). A plan file records its engine."""
    base: dict = {}
    if getattr(args, "plan", None):
        base = read_plan_file(args.plan)["plan"]
    for k in PLAN_FLAGS:
        v = getattr(args, k, None)
        if v is not None:
            base[k] = v
    if default_engine is not None and "engine" not in base:
        base["engine"] = default_engine
    vpp = base.get("vpp", 1)
    # a plan file's vpp that is not a count is left to Plan.from_dict, which names the key
    if isinstance(vpp, int) and not isinstance(vpp, bool) and vpp > 1 and "schedule" not in base:
        if base.get("pp", 1) == 1:
            raise ConfigError("--vpp", f"{base['vpp']} virtual stages per pipeline stage need --pp > 1 "
                              "(the interleaved schedule)", accepted="--vpp 1, or --pp 2 or more")
        base["schedule"] = "interleaved"
    base.update(sp_mode_fields(args))
    return Plan.from_dict(base, source=getattr(args, "plan", None) or "flags")


def defaulted_engine_error(e: ConfigError) -> ConfigError:
    """A --fix the default engine refuses, told as such: the fields the user pinned (not the engine, which
    they did not name) and that the engine was the default, which --engine changes."""
    if not e.field.startswith("--fix ") or "engine" not in e.field.split("--fix ", 1)[1].split(", "):
        return e
    pinned = [f for f in e.field.split("--fix ", 1)[1].split(", ") if f != "engine"]
    return ConfigError("--fix " + ", ".join(pinned), f"{e.problem} ({DEFAULT_ENGINE} is the default engine; "
                       "--engine picks another)", accepted=e.accepted, source=e.source)


def scenario_from_args(args) -> Scenario:
    """The scenario of --model, --cluster, --gpus, --db, --seq-len, --global-batch, --moe-imbalance."""
    return load_scenario(args.model, args.cluster, gpus=args.gpus, seq_len=args.seq_len,
                         global_batch=args.global_batch, moe_imbalance=args.moe_imbalance,
                         db=getattr(args, "db", None))


# The networkx fabric model builds every node, NIC and switch: about 7 s for 16 384 GPUs on one core
# and growing faster than linearly, so larger clusters are refused instead of left to run for minutes.
MAX_FABRIC_GPUS = 16384


def topology_from_args(args, gpus: int | None = None) -> dict | None:
    """The --network/--oversubscription fabric model, or None when neither is given (``gpus``: the
    cluster's GPU count, checked against what the fabric model handles)."""
    if args.network is None and args.oversubscription is None:
        return None
    if args.oversubscription is not None and args.oversubscription < 1:
        raise ConfigError("--oversubscription", f"must be >= 1 (1 = non-blocking), got {args.oversubscription}")
    if gpus is not None and gpus > MAX_FABRIC_GPUS:
        flag = "--network" if args.network is not None else "--oversubscription"
        raise ConfigError(flag, f"the fabric model places groups on at most {MAX_FABRIC_GPUS:,} GPUs, "
                          f"this cluster has {gpus:,}", accepted=f"--gpus up to {MAX_FABRIC_GPUS:,}, or no {flag}")
    return {"rail_optimized": args.network != "flat", "oversubscription": args.oversubscription}


def parse_or_exit_code(parser: argparse.ArgumentParser, argv):
    """``(args, None)``, or ``(None, exit code)`` when parsing ends the command (an error: 2, after its
    one-line message; --help: 0), so in-process callers get a code back instead of SystemExit."""
    try:
        return parser.parse_args(argv), None
    except SystemExit as e:
        return None, e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except ParaplanError as e:     # a flag's own check that raised a ConfigError
        print(f"paraplan: error: {e}", file=sys.stderr)
        return None, 2


def run_command(func, args) -> int:
    """Run a parsed command: a ParaplanError becomes one line on stderr and exit code 2."""
    try:
        return func(args)
    except ParaplanError as e:
        print(f"paraplan: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:       # Ctrl-C: one line, the shell's 128 + SIGINT, no traceback
        print("paraplan: interrupted", file=sys.stderr)
        return 130
