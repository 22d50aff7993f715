"""The clients users already have, against the reference server: the ``openai`` and
``anthropic`` SDKs (streaming and not), and loadlab's own Anthropic dialect on /v1/messages.

The byte tokenizer makes N ASCII characters N prompt tokens, and ``ignore_eos`` is on by
default, so every count below is exact.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anthropic
import openai
import pytest

from loadlab.clients import AnthropicClient
from loadlab.config import EndpointConfig
from loadlab.records import RequestSpec
from tests.helpers.server import API_KEY, post, session

MODEL = "loadlab-ref"
PROMPT = "x" * 37  # 37 tokens


def test_openai_sdk_chat_and_completions_streaming_and_not(continuous_server: Any) -> None:
    with openai.OpenAI(
        base_url=continuous_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=30
    ) as client:
        messages: Any = [{"role": "user", "content": PROMPT}]
        whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=9)
        assert whole.choices[0].finish_reason == "length"
        assert whole.usage is not None
        assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (37, 9)
        chunks = list(
            client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=9,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        deltas = [c for c in chunks if c.choices and c.choices[0].delta.content is not None]
        assert len(deltas) == 9  # one token per chunk
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5)
        assert text.usage is not None and text.usage.completion_tokens == 5
        pieces = list(
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, stream=True)
        )
        assert pieces[-1].choices[0].finish_reason == "length"
        assert len([p for p in pieces if p.choices[0].finish_reason is None]) == 5
        models = client.models.list()
        assert [m.id for m in models.data] == [MODEL]


def test_openai_sdk_sees_errors_as_its_exception_types(continuous_server: Any) -> None:
    url = continuous_server.url + "/v1"
    with openai.OpenAI(base_url=url, api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    with openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0) as client:
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="nope", prompt=PROMPT, max_tokens=1)
        with pytest.raises(openai.BadRequestError, match="context"):
            client.completions.create(model=MODEL, prompt="x" * 120, max_tokens=100)


def test_anthropic_sdk_messages_streaming_and_not(continuous_server: Any) -> None:
    with anthropic.Anthropic(
        base_url=continuous_server.url, api_key=API_KEY, max_retries=0, timeout=30
    ) as client:
        messages: Any = [{"role": "user", "content": PROMPT}]
        msg = client.messages.create(model=MODEL, max_tokens=9, messages=messages)
        assert (msg.role, msg.stop_reason, msg.content[0].type) == (
            "assistant",
            "max_tokens",
            "text",
        )
        # Anthropic's input_tokens leaves out what the (prefix) cache served
        cached = msg.usage.cache_read_input_tokens or 0
        assert (msg.usage.input_tokens + cached, msg.usage.output_tokens) == (37, 9)
        # system first, joined by "\n" as the chat prompt is: 3 + 1 + 37 tokens
        with client.messages.stream(
            model=MODEL, max_tokens=6, messages=messages, system="abc"
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert final.stop_reason == "max_tokens" and final.content[0].type == "text"
        assert final.content[0].text == text
        cached = final.usage.cache_read_input_tokens or 0
        assert (final.usage.input_tokens + cached, final.usage.output_tokens) == (41, 6)
        kinds = [e.type for e in client.messages.create(
            model=MODEL, max_tokens=4, messages=messages, stream=True
        )]  # fmt: skip
        assert kinds[:2] == ["message_start", "content_block_start"]
        assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert 1 <= kinds.count("content_block_delta") <= 4  # a partial UTF-8 byte sends none


def test_anthropic_sdk_key_and_errors(continuous_server: Any) -> None:
    messages: Any = [{"role": "user", "content": PROMPT}]
    with anthropic.Anthropic(
        base_url=continuous_server.url, api_key="wrong", max_retries=0
    ) as client:
        with pytest.raises(anthropic.AuthenticationError):
            client.messages.create(model=MODEL, max_tokens=1, messages=messages)
    with anthropic.Anthropic(
        base_url=continuous_server.url, api_key=API_KEY, max_retries=0
    ) as client:
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=MODEL, max_tokens=120, messages=messages)


@pytest.mark.parametrize("stream", [True, False])
def test_loadlab_anthropic_dialect_counts_exactly(continuous_server: Any, stream: bool) -> None:
    ep = EndpointConfig(
        continuous_server.url, model=MODEL, api="anthropic", api_key_env="LOADLAB_TEST_KEY"
    )

    async def go() -> Any:
        async with AnthropicClient(ep, stream=stream) as client:
            spec = RequestSpec("a", PROMPT, 9, prompt_tokens=37)
            return (await client.send(spec, t0_ns=time.perf_counter_ns())).record

    r = asyncio.run(go())
    assert (r.outcome, r.prompt_tokens, r.output_tokens, r.finish_reason) == (
        "ok",
        37,
        9,
        "max_tokens",
    )
    # the prompt may be in the prefix cache (other tests send it too): its 2 full blocks of 16
    assert r.server["cache_read_input_tokens"] in (0, 32)
    assert r.server["cache_creation_input_tokens"] == 0


def test_detokenize_lets_vllm_bench_cut_prompts_to_exact_lengths(continuous_server: Any) -> None:
    """``vllm bench serve`` aligns its prompts to a server's tokenizer through /tokenize and
    /detokenize (vLLM's shapes): cut to N tokens and decoded, a prompt is counted N again."""

    async def go() -> tuple[Any, ...]:
        async with session() as s:
            url = continuous_server.url
            _, tok, _ = await post(s, url + "/tokenize", {"model": MODEL, "prompt": "héllo world"})
            status, text, _ = await post(
                s, url + "/detokenize", {"model": MODEL, "tokens": tok["tokens"][:7]}
            )
            _, again, _ = await post(
                s, url + "/tokenize", {"model": MODEL, "prompt": text["prompt"]}
            )
            return tok, status, text, again

    tok, status, text, again = asyncio.run(go())
    assert tok["count"] == 12 and status == 200  # é is two bytes
    assert text == {"prompt": "héllo "} and again["count"] == 7
