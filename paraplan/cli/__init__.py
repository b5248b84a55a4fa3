"""paraplan command line: parse, load, call, print. Errors a user can fix print one line, exit 2.

One module per command (``estimate``, ``list``, ``plan``, ``export``, ``whatif``, ``validate`` and
``profile``, ``cf``), each with a ``register(subparsers)``; the flags they share live in
:mod:`paraplan.cli.common`.
"""
from __future__ import annotations

import argparse
import sys

from paraplan.cli import catalog, cf, estimate, export, plan, validate, whatif
from paraplan.cli.common import run_command

COMMANDS = (estimate, catalog, plan, export, whatif, validate, cf)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paraplan", description="Simulate and plan parallel training layouts.")
    sub = ap.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
