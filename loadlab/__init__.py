"""loadlab: load testing and SLO evaluation for LLM inference endpoints."""

from __future__ import annotations

from loadlab._version import __version__

__all__ = ["__version__"]
