"""`paraplan export PLAN.json --to megatron|deepspeed|torchtitan [--torchtitan-format python|toml] [--out FILE]`."""
from __future__ import annotations

import argparse
import sys

from paraplan.cli.common import ParaplanArgumentParser, check_out_path, parse_or_exit_code, run_command, writing
from paraplan.io import write_atomic
from paraplan.planfile import read_plan_file
from paraplan.planner.export import ENGINES, export
from paraplan.planner.export_torchtitan import TORCHTITAN_FORMATS


def add_export_args(ap: argparse.ArgumentParser) -> None:
    """The plan file, --to ENGINE and --out FILE."""
    ap.add_argument("plan_file", metavar="PLAN.json", help="a plan file written by `paraplan plan --out`")
    # validated in cmd_export (not argparse choices) so an unknown engine is a one-line ConfigError
    ap.add_argument("--to", dest="engine", required=True, metavar="|".join(ENGINES),
                    help="which engine's launch config to write")
    ap.add_argument("--torchtitan-format", default="python", metavar="|".join(TORCHTITAN_FORMATS),
                    help="torchtitan's config format: python (a config registry module for torchtitan 0.3.0, the "
                         "default) or toml (the job config of torchtitan 0.2.x)")
    ap.add_argument("--out", metavar="FILE", help="write to this file (atomically) instead of stdout")


def cmd_export(args) -> int:
    """Write the plan file as the engine's launch config (to --out or stdout); the release it targets and
    both estimates (the plan's, and the exported plan's as the engine runs it) go to stderr, and the notes
    where the text cannot carry them."""
    if args.out is not None:
        check_out_path("--out", args.out, folder=False)
    doc = read_plan_file(args.plan_file, "PLAN.json")
    result = export(doc, args.engine, source=args.plan_file, torchtitan_format=args.torchtitan_format)
    if args.out:
        # the Megatron-LM script is made executable (x bits under the umask) before it is renamed in
        with writing("--out", args.out):
            write_atomic(args.out, result.text, executable=result.text.startswith("#!"))
    else:
        sys.stdout.write(result.text)
    print(f"paraplan: export for {result.target}; {result.summary}", file=sys.stderr)
    for note in result.notes[1:] if not result.notes_in_text else ():   # the others carry them as comments
        print(f"paraplan: note: {note}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    """Add ``export`` to the subparsers."""
    ex = subparsers.add_parser("export", help="write a plan as a Megatron-LM, DeepSpeed or torchtitan launch config")
    add_export_args(ex)
    ex.set_defaults(func=cmd_export)


def main(argv: list[str] | None = None) -> int:
    """Run `export` on its own (used by tests); errors print one line and return 2."""
    ap = ParaplanArgumentParser(prog="paraplan export")
    add_export_args(ap)
    args, code = parse_or_exit_code(ap, argv)
    return code if args is None else run_command(cmd_export, args)


if __name__ == "__main__":
    sys.exit(main())
