"""Where a run's files go: one results file per endpoint (``--out``, else
``reports/run-<UTC time>.json``), each with its journal started before any request is sent
(``loadlab.journal``), and a comparison next to them when the run had several endpoints.

Example::

    out = Outputs.start(cfg)             # paths checked, journals started
    note = out.write(0, results)         # None, or where the records are when the write failed
    out.discard(first=1)                 # journals of endpoints that never ran
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from loadlab.config import RunConfig
from loadlab.journal import prepare_output
from loadlab.results import Results, write_results

if TYPE_CHECKING:
    from loadlab.analysis.compare import Comparison

__all__ = ["Outputs", "out_paths"]


def out_paths(cfg: RunConfig, names: list[str]) -> list[Path]:
    """One results file per endpoint: the --out name, or reports/run-<UTC time>.json."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = Path(cfg.out) if cfg.out else Path("reports") / f"run-{stamp}.json"
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

    def write(self, index: int, results: Results) -> str | None:
        """Write endpoint ``index``'s results file and drop its journal; on failure, what to
        tell the user (where every record is, and how to rebuild the file)."""
        path, journal = self.paths[index], self.journals[index]
        try:
            write_results(results, path)
        except OSError as exc:
            return (
                f"could not write {path}: {exc.strerror or exc}. Every record is in the journal "
                f"{journal}: rebuild the results with "
                f"loadlab report --from-journal {journal} --out NEW.json"
            )
        with contextlib.suppress(OSError):
            journal.unlink()
        return None

    def discard(self, first: int = 0) -> None:
        """Drop the journals from endpoint ``first`` on (they never ran: nothing to keep)."""
        for journal in self.journals[first:]:
            with contextlib.suppress(OSError):
                journal.unlink()

    def write_comparison(self, cmp: Comparison, names: list[str]) -> tuple[Path, Path]:
        """``<out>.compare.md`` and ``<out>.compare.json`` next to the results files."""
        from loadlab.report.comparison import render_comparison_markdown

        first = self.paths[0]
        stem = first.stem.removesuffix(f"-{names[0]}")
        # ".compare", not "-compare": out-*.json globs the results files only
        md, js = first.with_name(f"{stem}.compare.md"), first.with_name(f"{stem}.compare.json")
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(render_comparison_markdown(cmp), encoding="utf-8")
        js.write_text(json.dumps(cmp.to_dict(), indent=2) + "\n", encoding="utf-8")
        return md, js
