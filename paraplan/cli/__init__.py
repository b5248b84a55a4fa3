"""paraplan command line: parse, load, call, print. Errors a user can fix print one line, exit 2.

One module per command (``estimate``, ``list``, ``plan``, ``export``, ``whatif``, ``validate`` and
``profile``, ``score``, ``cf``, ``calibrate``), each with a ``register(subparsers)``; the flags they share live in
:mod:`paraplan.cli.common`.
"""
from __future__ import annotations

import contextlib
import sys

from paraplan.cli import calibrate, catalog, cf, estimate, export, plan, score, validate, whatif
from paraplan.cli.common import ParaplanArgumentParser, parse_or_exit_code, run_command
from paraplan.errors import missing_extra_of

COMMANDS = (estimate, catalog, plan, export, whatif, validate, score, cf, calibrate)


def build_parser() -> ParaplanArgumentParser:
    ap = ParaplanArgumentParser(prog="paraplan", description="Simulate and plan parallel training layouts.")
    sub = ap.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return ap


def command_name(args) -> str:
    """'paraplan cf validate': the command a parsed ``args`` runs."""
    return " ".join(["paraplan", args.command] + ([args.cf_command] if getattr(args, "cf_command", None) else []))


@contextlib.contextmanager
def escaped_output():
    """stdout and stderr that write a character their encoding cannot hold as an escape (``\\udc80``)
    instead of raising, for the length of one command. Under a UTF-8 locale Python's stdout is strict,
    and the text paraplan echoes holds what the user typed: a path whose bytes are not UTF-8 arrives as
    lone surrogates (``--out $'\\x80'``: the report was written, then ``wrote ...`` raised
    UnicodeEncodeError), a JSON model name may hold any. Errors already print escaped
    (:func:`paraplan.errors.printable`); the streams' own settings come back afterwards."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):       # a closed or detached stream: leave it
                continue
            changed.append(stream)
    try:
        yield
    finally:
        for stream in changed:
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="strict")


def main(argv: list[str] | None = None) -> int:
    """Parse and run one command: 0 done, 2 a user's error in one line (3: no plan fits, for plan/whatif).
    An optional extra that is not installed (torch) is such an error wherever it is first imported:
    the commands name it where they start (:func:`paraplan.errors.require_extra`); this is the net
    under any import they do not check. Output escapes what its encoding cannot write (:func:`escaped_output`)."""
    with escaped_output():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args, code = parse_or_exit_code(build_parser(), argv)
    if args is None:
        return code
    try:
        return run_command(args.func, args)
    except ImportError as e:
        missing = missing_extra_of(e, command_name(args))
        if missing is None:
            raise
        print(f"paraplan: error: {missing}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
