"""A recording's layout and the replay built from it, without a server: the trace's blocks are
the server's prompt's blocks, and a replayed later turn knows what its answer added."""

from __future__ import annotations

import json
from pathlib import Path

from loadlab._record.shape import RequestShape, block_ids
from loadlab.config import RunConfig
from loadlab.workloads._replay import trace_requests
from reference_server.protocol import ChatMessage, chat_prompt

SALT = b"0123456789abcdef0123456789abcdef"
AGENT_STEP = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "agent-00001-0 find the files that mention the cache"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "search", "arguments": '{"input": "cache \\u00e9"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "agent-00001-1 three files: a, b, c"},
]  # fmt: skip


def test_the_layout_is_the_servers_prompt_block_for_block() -> None:
    """No role marker shifts the blocks: prompts that share less than a block of the server's
    prompt share no id, and an agent's step (system, task, tool call, result) is laid out as
    the reference server reads it (contents and a call's arguments, joined by newlines)."""
    shape = RequestShape.of("chat", {"messages": AGENT_STEP}, salt=SALT, block=16)
    served = chat_prompt([ChatMessage.model_validate(m) for m in AGENT_STEP])
    assert shape.prompt_length == len(served)
    assert shape.hash_ids == block_ids(served, 16, SALT)
    one, two = (
        {"messages": [{"role": "user", "content": f"agent-0000{i}-0 task"}]} for i in (1, 2)
    )
    ids = [RequestShape.of("chat", b, salt=SALT, block=16).hash_ids for b in (one, two)]
    assert ids[0] and ids[1] and ids[0][0] != ids[1][0]  # 10 characters alike: no block


def _trace(tmp_path: Path, version: int, unit: str = "chars") -> Path:
    head = {"loadlab_trace": version, "unit": unit, "block": 16}
    common = {"output_length": 8, "api": "chat", "max_tokens": 8, "outcome": "ok", "session": 0,
              "tools": 1, "tools_length": 120, "new_kind": "tool"}  # fmt: skip
    lines = [
        head,
        {**common, "timestamp": 0, "input_length": 100, "prompt_length": 100, "hash_ids": [1] * 6,
         "turn": 0, "new_length": 100, "answer_tool_call": True},
        {**common, "timestamp": 900, "input_length": 202, "prompt_length": 202, "hash_ids": [],
         "turn": 1, "new_length": 50, "think_ms": 100, "answer_tool_call": False},
    ]  # fmt: skip
    path = tmp_path / f"trace{version}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_a_replayed_step_carries_what_the_recorded_answer_added(tmp_path: Path) -> None:
    def specs(path: Path, cpt: float = 1.0) -> list:
        workload = {"kind": "trace", "path": str(path), "chars_per_token": cpt}
        return list(trace_requests(RunConfig(rate_rps=1, requests=2, workload=workload)))

    first, step = specs(_trace(tmp_path, 2))
    assert first.answer_chars is None and first.prompt_tokens == 100
    assert step.tool_turn and step.answer_chars == 202 - 100 - 50  # separators and arguments
    assert len(step.prompt) == 50
    # a target of 4 characters a token: the new message is 50 characters, 12 or 13 tokens
    _, step = specs(_trace(tmp_path, 2), cpt=4.0)
    assert step.answer_chars == 52 and step.prompt_tokens == round(50 / 4)
    # in the tokenizer's unit: lengths scaled to characters
    _, step = specs(_trace(tmp_path, 2, unit="tokens"), cpt=4.0)
    assert step.answer_chars == 52 * 4 and step.prompt_tokens == 50
    # a trace laid out with role markers: its turns go at their recorded new lengths
    assert [s.answer_chars for s in specs(_trace(tmp_path, 1))] == [None, None]
