"""The ``loadlab`` command: one entry point, one module per subcommand.

Each subcommand lives in ``loadlab/_commands/<name>.py`` and defines::

    def add_arguments(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace) -> int: ...   # the process exit code

Its one-line help is in ``COMMANDS`` below, the one source of ``--help``: modules are imported
only when their command runs (the server's torch and Locust's gevent never load for
``loadlab report``).

Exit codes: what the command returns; 2 for any ``loadlab.errors.LoadlabError`` (bad input,
printed as one line, mapped here and nowhere else), a bad flag or an input file nested too
deeply to parse (``RecursionError``); 128 + the signal's number when a stop signal ends it (130 on Ctrl-C,
143 on SIGTERM, 129 on SIGHUP: ``loadlab._runner.signals``). Any other
exception is a bug: its traceback is printed and the exit code is 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from loadlab.errors import LoadlabError

__all__ = ["COMMANDS", "main"]

# name -> (module, one-line help). Order is the order of --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("loadlab._commands.run", "run a load test and write a results file"),
    "report": ("loadlab._commands.report", "summarise a results file (text; --html, --csv, --slo)"),
    "slo": (
        "loadlab._commands.slo",
        "judge a results file against an SLO file (CI gate): exit 0 pass, 1 fail, 2 invalid",
    ),
    "compare": (
        "loadlab._commands.compare",
        "compare results files side by side (first = baseline); gate on significant regressions",
    ),
    "sweep": ("loadlab._commands.sweep", "find the highest load that meets the SLOs"),
    "merge": ("loadlab._commands.merge", "join the results files of one run's --shard parts"),
    "capacity": ("loadlab._commands.capacity", "estimate GPUs needed; hold estimates against runs"),
    "simulate": ("loadlab._commands.simulate", "predict a run by simulation; write a results file"),
    "selftest": ("loadlab._commands.selftest", "measure this generator's own timing error"),
    "lab": ("loadlab._commands.lab", "the reference server's four modes side by side"),
    "record": (
        "loadlab._commands.record",
        "a proxy that records the shape of real traffic (no text) for replay",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loadlab", description=__doc__.splitlines()[0])
    from loadlab._version import __version__

    parser.add_argument("--version", action="version", version=f"loadlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the process is this command (not cli.main([...]) inside a program)
        from loadlab._runner import signals

        signals.owns_process()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = build_parser()
        if not argv:
            parser.print_help()
            return 2
        parser.parse_args(argv)  # prints usage / version and exits
        return 2
    name = argv[0]
    module_name, help_text = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        from loadlab.errors import EXTRAS, INSTALL

        top = (exc.name or "").split(".")[0]
        extra = next((e for e, mods in EXTRAS.items() if top in mods), None)
        if extra is None:
            raise
        print(
            f"loadlab {name}: needs the {extra!r} extra ({top} is not installed); "
            f"install it with: {INSTALL[extra]}",
            file=sys.stderr,
        )
        return 2
    parser = argparse.ArgumentParser(prog=f"loadlab {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    try:
        return int(module.run(args))
    except LoadlabError as exc:  # the one place input errors become exit code 2
        from loadlab.records import printable

        lines = str(exc).split("\n")  # a scenario's problems come one a line
        print(f"loadlab {name}: " + "\n".join(map(printable, lines)), file=sys.stderr)
        return 2
    except RecursionError:  # a file nested thousands deep that a reader did not name itself
        from loadlab.errors import TOO_DEEP

        print(f"loadlab {name}: an input file is {TOO_DEEP}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM / SIGHUP where a command installed signals
        from loadlab._runner import signals

        print(f"loadlab {name}: interrupted", file=sys.stderr)
        return signals.exit_code()
