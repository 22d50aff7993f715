"""A small BPE tokenizer trained on the spot, with a chat template: a real tokenizer for tests.

``make_tokenizer_dir(folder)`` writes what a HuggingFace model folder holds for its tokenizer
(``tokenizer.json``, ``tokenizer_config.json`` with ``bos_token``, ``eos_token`` and a
Llama-3-style ``chat_template``), trained in about a second from loadlab's prompt corpus plus
some punctuation and digits. Byte-level, so any text encodes. Completions get a BOS token from
the post-processor, as Llama tokenizers do; the chat template writes BOS itself. Needs the
optional ``tokenizers`` package.

Example::

    folder = make_tokenizer_dir(tmp_path / "tok")
    load_tokenizer(str(folder)).count_prompt("hello", "chat")
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["BOS", "CHAT_TEMPLATE", "EOS", "make_tokenizer_dir"]

BOS, EOS = "<|begin_of_text|>", "<|eot_id|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] | trim }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
SPECIALS = [BOS, EOS, "<|start_header_id|>", "<|end_header_id|>"]


def make_tokenizer_dir(folder: Path, vocab_size: int = 600) -> Path:
    """Train and save the tokenizer into ``folder``; returns ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from loadlab.workloads._prompts import corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = corpus()[:200_000]
    extra = "Hello, world! 0123456789 user assistant system: (a) [b] {c} 'quoted' \"double\"\n"
    tok.train_from_iterator(
        [text[i : i + 2000] for i in range(0, len(text), 2000)] + [extra] * 20, trainer
    )
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": BOS,
        "eos_token": {"content": EOS, "lstrip": False, "rstrip": False},
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 2048,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder
