"""The target model's tokenizer: how many prompt tokens the *server* will count.

``load_tokenizer(spec)`` takes what ``--tokenizer`` (or a workload's ``tokenizer`` key) names:

    byte | reference       the reference server's byte tokenizer (1 token per UTF-8 byte; its
                           chat formatting joins message contents with "\\n", no role markers)
    DIR                    a local HuggingFace tokenizer folder: ``tokenizer.json``, plus
                           ``tokenizer_config.json`` (special tokens, ``chat_template``) and
                           ``chat_template.jinja`` / ``chat_template.json`` when present
    FILE.json              a HuggingFace ``tokenizer.json`` (its folder's config is read too)
    FILE (.tiktoken, ...)  a tiktoken BPE file (base64 token, rank per line); the split pattern
                           is o200k's when the name says o200k, else cl100k's
    ORG/NAME               a model id, found in the local HuggingFace cache only (``HF_HUB_CACHE``,
                           ``HF_HOME``/hub, ``~/.cache/huggingface/hub``); nothing is downloaded

HF and tiktoken need the optional packages (``pip install 'loadlab[tokenizers]'``).

``count_prompt(text, api)`` is what a server counts for a request whose one user message (or
completions prompt) is ``text``. It follows vLLM's serving code, which SGLang matches:

- chat (and Anthropic Messages, which vLLM turns into a chat): the chat template rendered the
  way HF ``apply_chat_template`` does (sandboxed jinja2, ``trim_blocks``, ``lstrip_blocks``,
  ``add_generation_prompt=True``, the special tokens as variables), then encoded *without*
  adding special tokens (the template writes BOS itself);
- completions: the prompt encoded *with* the tokenizer's special tokens (BOS, if its
  post-processor adds one).

It is ``None`` for chat when the template is not known (a tokenizer.json alone, tiktoken): the
caller then asks the server instead.

Example::

    tok = load_tokenizer("models/tiny")          # tokenizer.json + tokenizer_config.json
    tok.count_prompt("Hello there", "chat")      # e.g. 14: the template's tokens included
    tok.count_prompt("Hello there", "completions")   # e.g. 3: BOS + 2
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Protocol

from loadlab.workloads._params import REPO_ROOT, WorkloadError

__all__ = [
    "BYTE_NAMES",
    "NOT_LOCAL",
    "SERVER_METHODS",
    "AnyTokens",
    "ByteTokens",
    "HFTokens",
    "TiktokenTokens",
    "Tokens",
    "chars_per_token",
    "check_tokenizer",
    "hf_cache_snapshot",
    "load_tokenizer",
    "render_chat_template",
    "resolve_tokenizer",
]

BYTE_NAMES = frozenset({"byte", "reference"})
# tokenizer values that ask the endpoint instead of a local tokenizer (loadlab.workloads._exact)
SERVER_METHODS = frozenset({"server", "calibrate", "auto"})
NOT_LOCAL = SERVER_METHODS | {"none"}
CHAT_APIS = frozenset({"chat", "anthropic"})

# tiktoken's split patterns (tiktoken_ext/openai_public.py): the .tiktoken file holds only ranks
_CL100K_PAT = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


class Tokens(Protocol):
    """A tokenizer as loadlab needs it (``HFTokens``, ``TiktokenTokens``, ``ByteTokens``)."""

    name: str

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` alone (no special tokens added)."""
        ...

    def count_prompt(self, text: str, api: str) -> int | None:
        """Prompt tokens a server counts for ``text`` as the one message under ``api``."""
        ...

    def token_ends(self, text: str) -> list[int]:
        """The character offset where each token of ``text`` ends (tokens per streamed chunk)."""
        ...

    def prompt_ids(self, text: str, api: str) -> list[int] | None:
        """The token ids ``count_prompt`` counts (None where it is None): what a server's
        prefix cache keys its blocks by."""
        ...


class ByteTokens:
    """The reference server's tokenizer: one token per UTF-8 byte; chat = contents joined."""

    name = "byte"
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def token_ends(self, text: str) -> list[int]:
        if text.isascii():
            return list(range(1, len(text) + 1))
        return [i + 1 for i, ch in enumerate(text) for _ in range(len(ch.encode("utf-8")))]

    def count_prompt(self, text: str, api: str) -> int | None:
        return len(text.encode("utf-8"))

    def prompt_ids(self, text: str, api: str) -> list[int] | None:
        return self.encode(text)

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        return "\n".join(str(m.get("content") or "") for m in messages)


class TiktokenTokens:
    """A tiktoken encoding read from a local BPE file. No chat template."""

    def __init__(self, path: Path) -> None:
        try:
            import tiktoken
            from tiktoken.load import load_tiktoken_bpe
        except ImportError:
            raise WorkloadError(_missing("tiktoken", path)) from None
        pat = _O200K_PAT if "o200k" in path.name else _CL100K_PAT
        ranks = load_tiktoken_bpe(str(path))
        self.name = path.name
        self.chat_template = None
        self._enc = tiktoken.Encoding(
            path.stem, pat_str=pat, mergeable_ranks=ranks, special_tokens={}
        )

    def encode(self, text: str) -> list[int]:
        return list(self._enc.encode(text, disallowed_special=()))

    def token_ends(self, text: str) -> list[int]:
        _, starts = self._enc.decode_with_offsets(self.encode(text))
        return [*starts[1:], len(text)] if starts else []

    def count_prompt(self, text: str, api: str) -> int | None:
        return None if api in CHAT_APIS else len(self.encode(text))

    def prompt_ids(self, text: str, api: str) -> list[int] | None:
        return None if api in CHAT_APIS else self.encode(text)


class HFTokens:
    """A HuggingFace ``tokenizers`` tokenizer plus its config (special tokens, chat template)."""

    def __init__(
        self, tokenizer_json: Path, config: Mapping[str, Any], chat_template: str | None
    ) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise WorkloadError(_missing("tokenizers", tokenizer_json)) from None
        self.name = str(tokenizer_json.parent.name or tokenizer_json.name)
        self._tok = Tokenizer.from_file(str(tokenizer_json))
        self.config = dict(config)
        self.chat_template = chat_template

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def token_ends(self, text: str) -> list[int]:
        """The character offset where each token of ``text`` ends."""
        return [end for _, end in self._tok.encode(text, add_special_tokens=False).offsets]

    def encode_with_specials(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The prompt text the server builds from ``messages`` (generation prompt added)."""
        if self.chat_template is None:
            raise WorkloadError(f"tokenizer {self.name}: no chat template")
        return render_chat_template(self._template, messages, self.special_tokens)

    def count_prompt(self, text: str, api: str) -> int | None:
        ids = self.prompt_ids(text, api)
        return None if ids is None else len(ids)

    def prompt_ids(self, text: str, api: str) -> list[int] | None:
        if api not in CHAT_APIS:
            return self.encode_with_specials(text)
        if self.chat_template is None:
            return None
        return self.encode(self.render_chat([{"role": "user", "content": text}]))

    @cached_property
    def special_tokens(self) -> dict[str, str]:
        """``bos_token``, ``eos_token``, ... as strings (the config may hold AddedToken dicts)."""
        out = {}
        for key, value in self.config.items():
            if key.endswith("_token"):
                if isinstance(value, Mapping):
                    value = value.get("content")
                if isinstance(value, str):
                    out[key] = value
        return out

    @cached_property
    def _template(self) -> Any:
        return _jinja_env().from_string(self.chat_template or "")


def _jinja_env() -> Any:
    """The environment transformers' ``_compile_jinja_template`` builds (same options, filters
    and globals), so a model's template renders here as it does in the server."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render_chat_template(
    template: Any, messages: Sequence[Mapping[str, Any]], special_tokens: Mapping[str, str]
) -> str:
    """Render a compiled chat template as ``apply_chat_template(tokenize=False,
    add_generation_prompt=True)`` does."""
    return str(
        template.render(
            messages=list(messages),
            tools=None,
            documents=None,
            add_generation_prompt=True,
            **special_tokens,
        )
    )


def _missing(package: str, path: Path | str) -> str:
    return (
        f"tokenizer {str(path)!r} needs the {package!r} package: "
        f"pip install 'loadlab[tokenizers]' (or pip install {package})"
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"{path}: not readable JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


def _chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    """The chat template, where transformers looks: ``chat_template.jinja``, then
    ``chat_template.json``, then ``tokenizer_config.json`` (a string, or a list of named
    templates of which "default" is used)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    tpl = _read_json(folder / "chat_template.json").get(
        "chat_template", config.get("chat_template")
    )
    if isinstance(tpl, list):
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, Mapping)}
        tpl = named.get("default")
    return tpl if isinstance(tpl, str) else None


def _hf_from_folder(folder: Path, tokenizer_json: Path) -> HFTokens:
    config = _read_json(folder / "tokenizer_config.json")
    return HFTokens(tokenizer_json, config, _chat_template(folder, config))


def hf_cache_snapshot(model_id: str, cache: Path | None = None) -> Path | None:
    """The local snapshot folder of ``model_id`` in the HuggingFace hub cache (``refs/main``,
    else the newest snapshot), or None when it is not cached. Never downloads."""
    if cache is None:
        env = os.environ
        hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
        home = env.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
        cache = Path(hub) if hub else Path(home) / "hub"
    repo = cache / ("models--" + model_id.replace("/", "--"))
    ref = repo / "refs" / "main"
    if ref.is_file():
        snap = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
        if snap.is_dir():
            return snap
    snaps = sorted((repo / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
    return snaps[-1] if snaps else None


AnyTokens = ByteTokens | HFTokens | TiktokenTokens


def chars_per_token(tok: AnyTokens, sample_chars: int = 20_000) -> float:
    """Characters per token of loadlab's prompt corpus under ``tok``: the first guess of a
    prompt's length in characters."""
    from loadlab.workloads._prompts import corpus

    text = corpus()[:sample_chars]
    return len(text) / max(1, len(tok.encode(text)))


def resolve_tokenizer(spec: str, bases: Sequence[Path] = ()) -> str:
    """``spec`` with a relative path made absolute (found against ``bases`` first), so a
    scenario's tokenizer does not depend on the working directory; other values unchanged."""
    if spec in NOT_LOCAL or spec in BYTE_NAMES or Path(spec).expanduser().is_absolute():
        return spec
    for base in (*bases, Path.cwd(), REPO_ROOT):
        if (base / spec).exists():
            return str((base / spec).resolve())
    return spec


def check_tokenizer(spec: str, bases: Sequence[Path] = ()) -> None:
    """Raise ``WorkloadError`` now, before any load, for a tokenizer that cannot be loaded."""
    if spec not in NOT_LOCAL:
        load_tokenizer(resolve_tokenizer(spec, bases))


@lru_cache(maxsize=8)
def load_tokenizer(spec: str, bases: tuple[Path, ...] = ()) -> AnyTokens:
    """The tokenizer ``spec`` names (see the module docstring); paths are found against
    ``bases``, the working directory, then as given."""
    if spec in BYTE_NAMES:
        return ByteTokens()
    raw = Path(spec).expanduser()
    candidates = [raw] if raw.is_absolute() else [*(b / raw for b in bases), raw]
    try:
        found = _load_path(spec, candidates)
    except WorkloadError:
        raise
    except Exception as exc:  # the tokenizers/tiktoken parsers raise their own types
        raise WorkloadError(f"tokenizer {spec!r}: cannot be read ({exc})") from None
    if found is not None:
        return found
    if "/" in spec and not spec.startswith((".", "/", "~")):
        snap = hf_cache_snapshot(spec)
        if snap is not None and (snap / "tokenizer.json").is_file():
            return _hf_from_folder(snap, snap / "tokenizer.json")
    raise WorkloadError(
        f"tokenizer {spec!r}: not a tokenizer folder, tokenizer.json or tiktoken file, and "
        "not a model id in the local HuggingFace cache; give a path, or fetch the model first "
        "(huggingface-cli download ORG/NAME tokenizer.json tokenizer_config.json)"
    )


def _load_path(spec: str, candidates: Sequence[Path]) -> AnyTokens | None:
    for path in candidates:
        if path.is_dir():
            if not (path / "tokenizer.json").is_file():
                raise WorkloadError(
                    f"tokenizer {spec!r}: {path} has no tokenizer.json (a slow-only tokenizer "
                    "can be converted with transformers: AutoTokenizer.from_pretrained(DIR)"
                    ".save_pretrained(DIR))"
                )
            return _hf_from_folder(path, path / "tokenizer.json")
        if path.is_file():
            if path.suffix == ".json":
                return _hf_from_folder(path.parent, path)
            return TiktokenTokens(path)
    return None
