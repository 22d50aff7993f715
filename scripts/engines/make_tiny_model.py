"""Make a tiny Llama-architecture model for engine tests: random weights, a BPE tokenizer
trained here on the spot, and a chat template. Nothing is downloaded.

Run with the engine's Python (it needs ``torch``, ``transformers`` and ``tokenizers``)::

    python scripts/engines/make_tiny_model.py DIR

Shapes are chosen for vLLM's CPU build: hidden 128 with 2 heads gives head_dim 64 (vLLM's CPU
attention rejects head_dim 16); 2048 positions so prompts of 1,900 tokens fit. The tokenizer is
byte-level BPE (every string encodes; corpus words merge into one or a few tokens, so a word is
not a token, as with real models). The same seed gives the same tokenizer and weights.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

__all__ = ["CHAT_TEMPLATE", "make_tiny_model"]

# <|role|>content\n per message, then <|assistant|> when a generation prompt is asked for.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_WORDS = (
    "the quick brown fox jumps over the lazy dog while serving tokens from a paged cache "
    "prefill decode batch latency throughput request stream model"
).split()
_SPECIAL = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]


def make_tiny_model(out: Path, *, seed: int = 0, max_positions: int = 2048) -> int:
    """Write the model and tokenizer to ``out``; returns the vocabulary size."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed)  # noqa: S311 - a corpus, not a secret
    corpus = [" ".join(rnd.choice(_WORDS) for _ in range(30)) for _ in range(2000)]
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    special = {"bos_token": "<s>", "eos_token": "</s>"}  # token names, not secrets (S106)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=max_positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(str(out), safe_serialization=True)
    return len(fast)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_model.py DIR")
    print(f"tiny model in {sys.argv[1]}: vocab {make_tiny_model(Path(sys.argv[1]))}")
