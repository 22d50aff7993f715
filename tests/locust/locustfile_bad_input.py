"""Locustfile for the bad-input test: every other request is one its workload could not build
(a dataset row whose image file is gone), the rest plain requests."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from loadlab.locust import LLMUser
from loadlab.records import RequestSpec


class BadInputUser(LLMUser):
    def make_specs(self, seed: int) -> Iterator[RequestSpec]:
        for n in itertools.count():
            error = "rows.jsonl row 3: image file 'gone.png' cannot be read" if n % 2 else None
            yield RequestSpec(f"r{n}", "hello there", 2, error=error)
