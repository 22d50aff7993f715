"""The bundled reference server: a real PyTorch transformer behind an OpenAI-compatible API."""
