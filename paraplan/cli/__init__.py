"""paraplan command line: parse, load, call, print. Errors a user can fix print one line, exit 2.

One module per command (``estimate``, ``list``, ``plan``, ``export``, ``whatif``, ``validate`` and
``profile``, ``score``, ``cf``), each with a ``register(subparsers)``; the flags they share live in
:mod:`paraplan.cli.common`.
"""
from __future__ import annotations

import sys

from paraplan.cli import catalog, cf, estimate, export, plan, score, validate, whatif
from paraplan.cli.common import ParaplanArgumentParser, parse_or_exit_code, run_command

COMMANDS = (estimate, catalog, plan, export, whatif, validate, score, cf)


def build_parser() -> ParaplanArgumentParser:
    ap = ParaplanArgumentParser(prog="paraplan", description="Simulate and plan parallel training layouts.")
    sub = ap.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args, code = parse_or_exit_code(build_parser(), argv)
    return code if args is None else run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
