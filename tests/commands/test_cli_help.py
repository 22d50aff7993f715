"""Help a person can scan: each command's flags in groups, the common first and the rare last,
with the defaults ``RunConfig`` holds; ``sweep`` and ``simulate`` take the run flags from the
one definition ``run`` uses."""

from __future__ import annotations

import argparse
import importlib

from loadlab.cli import COMMANDS
from loadlab.config import RunConfig

RUN_GROUPS = ("load", "workload", "request", "output", "advanced")


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"loadlab {command}")
    importlib.import_module(COMMANDS[command][0]).add_arguments(p)
    return p


def _groups(p: argparse.ArgumentParser) -> dict[str, list[str]]:
    return {
        str(g.title): [o for a in g._group_actions for o in a.option_strings]
        for g in p._action_groups
    }


def test_run_flags_come_in_groups_with_the_configs_defaults() -> None:
    p = _parser("run")
    groups = _groups(p)
    titles = [t for t in groups if t in RUN_GROUPS]
    assert titles == list(RUN_GROUPS) and list(groups)[-1] == "advanced"  # rare ones last
    assert groups["options"] == ["-h", "--help"]  # every flag is in a group
    assert "--rate" in groups["load"] and "--tokenizer" in groups["workload"]
    assert "--endpoint" in groups["request"] and "--workers" in groups["advanced"]
    text = " ".join(p.format_help().split())
    for flag, default in (
        ("--prompt-tokens P", RunConfig.prompt_tokens),
        ("--max-tokens M", RunConfig.max_tokens),
        ("--tokenizer SPEC", RunConfig.tokenizer),
        ("--workers N", RunConfig.workers),
        ("--transport {raw,aiohttp}", RunConfig.transport),
    ):
        help_of = text.split(flag, 2)[2].split(" --", 1)[0]  # after the usage line's mention
        assert f"(default: {default})" in help_of, (flag, help_of)
    assert "(default: a fresh one per run" in text


def test_sweep_and_simulate_share_the_run_flags() -> None:
    run = _groups(_parser("run"))
    for command in ("sweep", "simulate"):
        groups = _groups(_parser(command))
        for title in RUN_GROUPS:
            assert groups[title] == run[title], (command, title)
