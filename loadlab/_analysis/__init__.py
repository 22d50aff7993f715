"""The analysis layer: pure functions of records (metrics, the summary, token checks, prefix-cache
figures, the generator section, comparisons). Nothing here sends a request."""
