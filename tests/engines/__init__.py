"""Engine tests: loadlab against a real inference engine (vLLM CPU build)."""
