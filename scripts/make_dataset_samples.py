"""Write the dataset samples in loadlab/data/samples/ (one per format the dataset workload
reads). The text is written for loadlab (Apache-2.0, as the project); run again only to
change the samples: ``python3 scripts/make_dataset_samples.py`` (parquet and arrow need
pyarrow).
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "loadlab" / "data" / "samples"

TOPICS = [
    (
        "Explain how a paged key-value cache lets an inference server fit more requests in "
        "the same memory, and what happens when the cache is full.",
        "A paged cache stores each request's keys and values in fixed-size blocks, so memory "
        "is taken as the answer grows instead of reserved for the longest possible answer. "
        "When no block is free, the scheduler stops admitting new requests and may preempt a "
        "running one, recomputing or swapping its blocks later.",
    ),
    (
        "Write a short note for a new colleague on why the 99th percentile of time to first "
        "token matters more than its mean for a chat product.",
        "Users remember the slow answers. The mean hides a tail of requests that wait for a "
        "long prefill or a full batch; the 99th percentile says how long one request in a "
        "hundred waits, which is what a busy user meets several times a day.",
    ),
    (
        "Summarise the difference between open-loop and closed-loop load generation in three "
        "sentences.",
        "A closed loop sends the next request when one finishes, so a slow server receives "
        "less load and looks better than it is. An open loop sends on a schedule whatever "
        "happens, as real users do. Latency under an open loop includes the queueing a closed "
        "loop hides.",
    ),
    (
        "Give me a checklist for comparing two hosted language model endpoints fairly.",
        "Send the same prompts at the same rate to both, with prompt lengths counted by each "
        "endpoint's own tokenizer; ask for the same number of output tokens and ignore the "
        "end of sequence where allowed; run them interleaved; compare medians and tails with "
        "their confidence intervals.",
    ),
    (
        "What is speculative decoding, and why does it change how many tokens arrive in one "
        "streamed chunk?",
        "A small draft model proposes several tokens and the large model checks them in one "
        "step; every accepted token is emitted at once, so one chunk can carry several tokens "
        "and the gaps between chunks stop being the time per token.",
    ),
    (
        "Describe chunked prefill to someone who knows what a batch is.",
        "Instead of running a long prompt's prefill in one step, the server splits it into "
        "slices and runs each slice beside the decodes of other requests, so their tokens keep "
        "coming while the long prompt is read.",
    ),
]

FOLLOW_UPS = [
    "Can you make that shorter, for a slide?",
    "And what would you measure to check it on a real server?",
]
SYSTEM = "You are a concise assistant for engineers who run inference servers."


def sharegpt() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i, (q, a) in enumerate(TOPICS):
        conv = [{"from": "human", "value": q}, {"from": "gpt", "value": a}]
        if i % 2 == 0:  # multi-turn: two follow-ups, answered
            for f in FOLLOW_UPS:
                conv += [{"from": "human", "value": f}, {"from": "gpt", "value": a[: len(a) // 2]}]
        if i == 1:
            conv.insert(0, {"from": "system", "value": SYSTEM})
        rows.append({"id": f"sample-{i}", "conversations": conv})
    rows.append({"id": "no-user-turn", "conversations": [{"from": "gpt", "value": "Hello."}]})
    return rows


def custom_jsonl() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i, (q, a) in enumerate(TOPICS):
        if i % 3 == 0:
            rows.append({"prompt": q, "output_tokens": 48 + 16 * i})
        elif i % 3 == 1:
            rows.append(
                {
                    "messages": [
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": q},
                        {"role": "assistant", "content": a},
                        {"role": "user", "content": FOLLOW_UPS[0]},
                    ],
                    "output_tokens": 32,
                }
            )
        else:
            rows.append({"prompt": q, "completion": a})
    rows.append({"text": "a row with neither prompt nor messages is skipped and counted"})
    return rows


def hf_rows() -> list[dict[str, object]]:
    """The shape HF chat datasets use: a ``messages`` column of role/content structs."""
    return [
        {
            "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
            "source": "loadlab-sample",
        }
        for q, a in TOPICS
    ]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "sharegpt.json").write_text(json.dumps(sharegpt(), indent=1) + "\n", encoding="utf-8")
    lines = [json.dumps(r) for r in custom_jsonl()]
    (OUT / "custom.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    hf = hf_rows()
    # HF Dataset.to_json writes JSON lines
    (OUT / "hf.json").write_text("\n".join(json.dumps(r) for r in hf) + "\n", encoding="utf-8")
    import pyarrow as pa
    import pyarrow.ipc
    import pyarrow.parquet

    table = pa.Table.from_pylist(hf)
    pyarrow.parquet.write_table(table, OUT / "hf.parquet")
    # HF Dataset.save_to_disk writes the IPC stream format (data-00000-of-00001.arrow)
    with (
        pa.OSFile(str(OUT / "hf.arrow"), "wb") as sink,
        pyarrow.ipc.new_stream(sink, table.schema) as writer,
    ):
        writer.write_table(table)


if __name__ == "__main__":
    main()
