"""Where a run's files go: one results file per endpoint (``--out``, else
``reports/run-<UTC time>-<pid>.json``), each with its journal started before any request is
sent (``loadlab.journal``), and a comparison next to them when the run had several endpoints.

Example::

    out = Outputs.start(cfg)             # paths checked, journals started
    path, note = out.write(0, results)   # where the file is (None: nowhere), and what to say
    out.discard(first=1)                 # journals of endpoints that never ran
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from loadlab.config import RunConfig
from loadlab.journal import default_out_path, discard_journal, prepare_output, save_results
from loadlab.results import Results

if TYPE_CHECKING:
    from loadlab._analysis.compare import Comparison

__all__ = ["Outputs", "out_paths"]


def out_paths(cfg: RunConfig, names: list[str]) -> list[Path]:
    """One results file per endpoint: the --out name, or reports/run-<UTC time>-<pid>.json."""
    base = Path(cfg.out) if cfg.out else default_out_path("run")
    if len(names) == 1:
        return [base]
    return [base.with_name(f"{base.stem}-{n}{base.suffix or '.json'}") for n in names]


@dataclass
class Outputs:
    """The results files of one run (one per endpoint, in order) and their journals."""

    paths: list[Path]
    journals: list[Path]

    @classmethod
    def start(cls, cfg: RunConfig) -> Outputs:
        """Every results path checked (writable, not a folder, room for a first write) and its
        journal started, before any request is sent."""
        paths = out_paths(cfg, [ep.name for ep in cfg.endpoints])
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        journals = [
            prepare_output(
                path,
                {
                    "started_at": started_at,
                    "kind": "run",
                    "endpoint": ep.name,
                    "config": cfg.to_dict(),
                },
            )
            for ep, path in zip(cfg.endpoints, paths, strict=True)
        ]
        return cls(paths, journals)

    def write(self, index: int, results: Results) -> tuple[Path | None, str | None]:
        """Write endpoint ``index``'s results file (on a full disk: on another one) and drop
        its journal; where the file is (None: nowhere) and, when that is not the path asked
        for, what to tell the user (``loadlab.journal.save_results``)."""
        return save_results(results, self.paths[index], self.journals[index])

    def discard(self, first: int = 0) -> None:
        """Drop the journals from endpoint ``first`` on (they never ran: nothing to keep)."""
        for journal in self.journals[first:]:
            discard_journal(journal)

    def write_comparison(self, cmp: Comparison, names: list[str]) -> tuple[Path, Path]:
        """``<out>.compare.md`` and ``<out>.compare.json`` next to the results files."""
        from loadlab._report.comparison import render_comparison_markdown

        first = self.paths[0]
        stem = first.stem.removesuffix(f"-{names[0]}")
        # ".compare", not "-compare": out-*.json globs the results files only
        md, js = first.with_name(f"{stem}.compare.md"), first.with_name(f"{stem}.compare.json")
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(render_comparison_markdown(cmp), encoding="utf-8")
        js.write_text(json.dumps(cmp.to_dict(), indent=2) + "\n", encoding="utf-8")
        return md, js
