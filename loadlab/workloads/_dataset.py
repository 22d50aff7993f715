"""Real text: ShareGPT, your own JSONL, HuggingFace datasets stored locally.

``[workload] kind = "dataset"`` sends the prompts of a file instead of generated text::

    path                 the file: ShareGPT JSON, JSONL, a HF dataset as parquet, JSON (lines or
                         an array) or arrow, or a folder written by ``Dataset.save_to_disk``
    format               sharegpt | jsonl | json | parquet | arrow; default from the extension
                         (a folder: arrow)
    turns                "all" (default): a conversation's user turns are replayed one by one,
                         each after the answer to the previous one (a chat session: the
                         history sent is the answers actually received); "first": its first
                         user turn only, as an independent request
    prompt_tokens        cut every prompt to exactly this many tokens (a number or a
                         distribution); prompts shorter than their draw are skipped (counted)
    min_prompt_tokens    skip prompts shorter than this (counted)
    max_prompt_tokens    cut prompts longer than this to it
    output_tokens        answers asked (a number or a distribution); default: the length of the
                         conversation's own answer, else the row's ``output_tokens`` (or
                         ``max_tokens``), else the run's ``max_tokens``
    max_output_tokens    a cap on every answer
    think_time_s         between the turns of a conversation (a number or a distribution; 0)
    shuffle              read the conversations in a seeded random order (default false)
    repeat               start again at the end of the file (default false: the run ends there)
    image_column, audio_column, image_patch, image_max_side, audio_tokens_per_s
                         a row's images and audio clips, and how the target counts their
                         tokens (``loadlab.workloads._media``)

Rows: ``{"conversations": [{"from": "human" | "gpt" | "system", "value": ...}]}`` (ShareGPT),
``{"messages": [{"role": "user" | "assistant" | "system", "content": ...}]}``, or
``{"prompt": ..., "completion" | "response": ...}``, each with an optional ``output_tokens``
for its last turn. A system message is put before the next user message ("\\n" between them).
Rows without usable text (no user message, content that is not a string) are skipped and
counted.

Lengths are counted with the run's tokenizer when loadlab holds it (its sizing's, from the
run's ``tokenizer``: a folder, a file, ``byte``), else estimated at ``chars_per_token``. A cut prompt is given its requested
length (``prompt_tokens``), so the exact sizing (``loadlab.workloads._exact``) cuts it to exactly
that many tokens as the server counts them; an uncut prompt is sent as it is (no requested
length: the prompt-length match leaves it out).

``RequestStream.extra()``: ``{"kind": "dataset", "dataset": {"path", "format", "rows_read",
"conversations", "requests", "bad_rows", "bad_media", "too_short", "cut"}}``.

Example::

    cfg = RunConfig(concurrency=4, requests=50, workload={"kind": "dataset",
                    "path": "loadlab/data/samples/sharegpt.json", "max_prompt_tokens": 1024})
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadlab.config import RunConfig
from loadlab.errors import TOO_DEEP
from loadlab.records import RequestSpec
from loadlab.workloads._base import (
    COMMON_KEYS,
    RequestStream,
    caps,
    check_common,
    clamp,
    common_extra_body,
    int_stream,
    open_loop_times,
    rng_for,
)
from loadlab.workloads._exact import Sizing, draft_chars_per_token
from loadlab.workloads._lengths import Dist, parse_dist
from loadlab.workloads._media import MEDIA_KEYS, Media, MediaError, MediaReader, carried
from loadlab.workloads._params import (
    WorkloadError,
    check_keys,
    get_bool,
    get_int,
    resolve_path,
)

__all__ = ["FORMATS", "KEYS", "Turn", "conversation", "dataset_requests", "read_rows", "validate"]

FORMATS = ("sharegpt", "jsonl", "json", "parquet", "arrow")
KEYS = COMMON_KEYS | {
    "path",
    "format",
    "turns",
    "prompt_tokens",
    "min_prompt_tokens",
    "output_tokens",
    "think_time_s",
    "shuffle",
    "repeat",
    *MEDIA_KEYS,
}
_USER = {"human", "user"}
_ASSISTANT = {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}
_EXTENSIONS = {".json": "json", ".jsonl": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}


@dataclass(frozen=True)
class Turn:
    """One user message and what answered it in the dataset."""

    prompt: str
    answer: str | None = None  # the dataset's own answer (its length: the default output)
    output_tokens: int | None = None  # a length the row gives instead


@dataclass
class DatasetStats:
    path: str = ""
    format: str = ""
    rows_read: int = 0
    conversations: int = 0
    requests: int = 0
    bad_rows: int = 0
    bad_media: int = 0  # rows whose images or audio could not be read: bad_input records
    too_short: int = 0
    cut: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _format(path: Path, given: Any) -> str:
    if given is not None:
        if given not in FORMATS:
            raise WorkloadError(f"workload.format = {given!r}: choose one of {', '.join(FORMATS)}")
        return str(given)
    if path.is_dir():
        return "arrow"
    fmt = _EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        raise WorkloadError(
            f"workload.path = {str(path)!r}: cannot tell the format from the name; "
            f"set workload.format to one of {', '.join(FORMATS)}"
        )
    return fmt


def _pyarrow(fmt: str) -> Any:
    try:
        import pyarrow
    except ImportError:
        raise WorkloadError(
            f"workload.format = {fmt!r} needs pyarrow: pip install 'loadlab[datasets]'"
        ) from None
    return pyarrow


def _arrow_batches(path: Path) -> Iterator[Any]:
    """Record batches of an arrow file: HF ``save_to_disk`` writes the IPC stream format."""
    pa = _pyarrow("arrow")
    import pyarrow.ipc

    files = sorted(path.glob("*.arrow")) if path.is_dir() else [path]
    if not files:
        raise WorkloadError(f"workload.path = {str(path)!r}: a folder with no .arrow file")
    for f in files:
        with pa.memory_map(str(f)) as source:
            try:
                reader = pyarrow.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pyarrow.ipc.open_file(source)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)
                continue
            yield from reader


def read_rows(path: Path, fmt: str) -> Iterator[Any]:
    """The rows of a dataset file, one at a time where the format allows (JSON lines,
    parquet and arrow batches); a JSON array is read whole."""
    if fmt == "parquet":
        _pyarrow(fmt)
        import pyarrow.parquet

        for batch in pyarrow.parquet.ParquetFile(str(path)).iter_batches(batch_size=1024):
            yield from batch.to_pylist()
        return
    if fmt == "arrow":
        for batch in _arrow_batches(path):
            yield from batch.to_pylist()
        return
    with path.open(encoding="utf-8") as f:
        head = f.read(1)
        while head.isspace():
            head = f.read(1)
        f.seek(0)
        if head == "[":  # a JSON array: ShareGPT, or rows written as one list
            try:
                yield from json.load(f)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}: not valid JSON ({exc})") from None
            except RecursionError:
                raise WorkloadError(f"{path}: {TOO_DEEP}") from None
            return
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise WorkloadError(f"{path}:{n}: not a JSON line ({exc.msg})") from None
                except RecursionError:
                    raise WorkloadError(f"{path}:{n}: {TOO_DEEP}") from None


def _messages(row: Mapping[str, Any]) -> list[tuple[str, Any]] | None:
    if "conversations" in row:
        return [(str(m.get("from", "")).lower(), m.get("value")) for m in row["conversations"]]
    if "messages" in row:
        return [(str(m.get("role", "")).lower(), m.get("content")) for m in row["messages"]]
    if "prompt" in row:
        answer = row.get("completion", row.get("response"))
        return [("user", row["prompt"])] + ([("assistant", answer)] if answer else [])
    return None


def conversation(row: Any) -> list[Turn] | None:
    """A row's user turns with their answers (module docstring), or None when it has none."""
    if not isinstance(row, Mapping):
        return None
    try:
        messages = _messages(row)
    except (AttributeError, TypeError):
        return None
    if not messages:
        return None
    turns: list[Turn] = []
    system: list[str] = []
    for role, content in messages:
        if not isinstance(content, str):
            return None  # multimodal parts or a missing text: not a text prompt
        if role == "system":
            system.append(content)
        elif role in _USER:
            turns.append(Turn("\n".join([*system, content])))
            system = []
        elif role in _ASSISTANT and turns and turns[-1].answer is None:
            turns[-1] = Turn(turns[-1].prompt, content)
    if not turns or not all(t.prompt.strip() for t in turns):
        return None
    out = row.get("output_tokens", row.get("max_tokens"))
    if isinstance(out, int) and not isinstance(out, bool) and out >= 1:
        turns[-1] = Turn(turns[-1].prompt, turns[-1].answer, out)
    return turns


def _dist(params: Mapping[str, Any], key: str, integer: bool = True) -> Dist | None:
    if key not in params:
        return None
    return parse_dist(params[key], key, integer=integer)


def validate(cfg: RunConfig, params: Mapping[str, Any], bases: Sequence[Path] = ()) -> Path:
    """Check the keys and the file (its format, and that its first row is readable)."""
    check_keys("dataset", params, KEYS)
    if "path" not in params:
        raise WorkloadError(
            'workload.path: missing; a dataset needs path = "FILE" (ShareGPT JSON, JSONL, '
            "parquet, JSON or arrow)"
        )
    path = resolve_path(str(params["path"]), "workload.path", bases)  # a file or a folder
    fmt = _format(path, params.get("format"))
    turns = params.get("turns", "all")
    if turns not in ("all", "first"):
        raise WorkloadError(f'workload.turns = {turns!r}: "all" or "first"')
    for key in ("prompt_tokens", "output_tokens"):
        _dist(params, key)
    _dist(params, "think_time_s", integer=False)
    get_int(params, "min_prompt_tokens", None)
    get_bool(params, "shuffle", False)
    get_bool(params, "repeat", False)
    check_common(params, bases)
    first = next(read_rows(path, fmt), None)
    if first is None:
        raise WorkloadError(f"workload.path = {str(path)!r}: the dataset has no rows")
    MediaReader.of(params, path).check(first, cfg)
    return path


def _counter(sizing: Sizing | None, chars_per_token: float) -> Callable[[str], int]:
    """Tokens of a text: the run's tokenizer when loadlab holds it, else the estimate."""
    tok = sizing.tokens if sizing is not None else None
    if tok is not None:
        return lambda text: len(tok.encode(text))
    return lambda text: max(1, round(len(text) / chars_per_token))


def dataset_requests(cfg: RunConfig, sizing: Sizing | None = None) -> RequestStream:
    params = cfg.workload
    chars_per_token = draft_chars_per_token(params, sizing)
    path = validate(cfg, params)
    fmt = _format(path, params.get("format"))
    stats = DatasetStats(path=str(path), format=fmt)
    count = _counter(sizing, chars_per_token)
    first_only = params.get("turns", "all") == "first"
    prompt_d, output_d = _dist(params, "prompt_tokens"), _dist(params, "output_tokens")
    think_d = _dist(params, "think_time_s", integer=False)
    min_prompt = get_int(params, "min_prompt_tokens", None)
    max_prompt, max_output = caps(params)
    shuffle, repeat = get_bool(params, "shuffle", False), get_bool(params, "repeat", False)
    cls = str(params.get("request_class", "dataset"))
    n = cfg.requests if cfg.duration_s is None else None
    starts = open_loop_times(cfg, n)
    # with a tokenizer the exact sizing cuts each prompt to its requested length itself (a
    # prefix of the text, as the server counts it); without, the estimate cuts it here
    sized = sizing is not None and sizing.fitter is not None

    media_of = MediaReader.of(params, path).read

    def with_media(row: Any) -> Media | str:
        """The row's media, or why they cannot be sent (its requests are then bad_input)."""
        try:
            return carried(media_of(row), cfg)
        except (MediaError, WorkloadError) as exc:
            stats.bad_media += 1
            return f"{path.name} row {stats.rows_read}: {exc}"

    def conversations() -> Iterator[tuple[list[Turn], Media | str]]:
        order = rng_for(cfg.request_seed, "pairs")
        for _ in itertools.count() if repeat else range(1):
            rows = read_rows(path, fmt)
            if shuffle:
                rows_list = list(rows)
                rows = iter([rows_list[i] for i in order.permutation(len(rows_list))])
            any_row = False
            for row in rows:
                stats.rows_read += 1
                turns = conversation(row)
                if turns is None:
                    stats.bad_rows += 1
                    continue
                any_row = True
                yield (turns[:1] if first_only else turns), with_media(row)
            if not any_row:
                return

    def specs() -> Iterator[RequestSpec]:
        prompts = int_stream(prompt_d, rng_for(cfg.request_seed, "prompt")) if prompt_d else None
        outputs = int_stream(output_d, rng_for(cfg.request_seed, "output")) if output_d else None
        think_rng = rng_for(cfg.request_seed, "think")
        start_iter = iter(starts) if starts is not None else None
        for c, (turns, media) in enumerate(conversations()):
            start = None
            if start_iter is not None:
                start = next(start_iter, None)
                if start is None:
                    return  # the arrival process has no more conversations
            stats.conversations += 1
            session = f"ds{c:06d}" if len(turns) > 1 else None
            for k, turn in enumerate(turns):
                if cfg.requests is not None and stats.requests >= cfg.requests:
                    return
                text, want = turn.prompt, None
                have = count(text)
                if prompts is not None:
                    want = next(prompts)
                elif max_prompt is not None and have > max_prompt:
                    want = max_prompt
                if (min_prompt is not None and have < min_prompt) or (
                    want is not None and have < want
                ):
                    stats.too_short += 1
                    break  # a conversation stops at a turn it cannot send
                # the media go with the first turn (later turns carry them in their history);
                # media of unknown tokens (an image URL, an MP3 clip) leave no requested length
                sent = media if k == 0 else Media()
                unknown = isinstance(sent, Media) and sent.tokens is None
                if want is not None:
                    stats.cut += 1
                    if not sized or unknown:
                        text = text[: max(1, round(want * chars_per_token))].rstrip()
                if outputs is not None:
                    out = next(outputs)
                elif turn.output_tokens is not None:
                    out = turn.output_tokens
                elif turn.answer:
                    out = count(turn.answer)
                else:
                    out = cfg.max_tokens
                out = clamp(out, max_output)
                think = float(think_d.sample(think_rng, 1)[0]) if think_d and k else 0.0
                stats.requests += 1
                spec = RequestSpec(
                    request_id=f"ds-{c:06d}-{k}",
                    prompt=text,
                    max_tokens=out,
                    intended_at_s=start if k == 0 else None,
                    prompt_tokens=None if unknown else want,
                    session_id=session,
                    turn=k if session else 0,
                    think_time_s=think,
                    request_class=cls,
                    extra_body=common_extra_body(params, out),
                )
                yield _with(spec, sent)

    return RequestStream(specs(), lambda: {"kind": "dataset", "dataset": stats.to_dict()})


def _with(spec: RequestSpec, media: Media | str) -> RequestSpec:
    """``spec`` carrying a row's media, or the reason they cannot be sent."""
    if isinstance(media, str):
        return dataclasses.replace(spec, error=media)
    if not media.images and not media.audio:
        return spec
    return dataclasses.replace(
        spec,
        images=media.images,
        image_sizes=media.image_sizes,
        image_tokens=media.image_tokens or 0,
        audio=media.audio,
        audio_s=media.audio_s,
        audio_tokens=media.audio_tokens or 0,
    )
