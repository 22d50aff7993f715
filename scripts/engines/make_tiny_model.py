"""Make tiny models for engine tests: random weights, a BPE tokenizer trained here on the spot.
Nothing is downloaded.

- ``make_tiny_model``: a Llama-architecture chat model (with a chat template);
- ``make_tiny_embedder``: a BERT-architecture ``BertModel`` (vLLM serves it on
  ``/v1/embeddings``, CLS pooling);
- ``make_tiny_reranker``: a ``BertForSequenceClassification`` with one label, a cross-encoder
  (vLLM serves it on ``/rerank``, ``/v1/rerank`` and ``/score``);
- ``make_tiny_vlm``: a ``Blip2ForConditionalGeneration`` (a 64-pixel ViT, a Q-Former of 8
  queries, an OPT language model) with the chat model's tokenizer and template plus
  ``<image>``: vLLM puts 8 ``<image>`` tokens before the prompt for its one image. (vLLM 0.32's
  LLaVA and PaliGemma cannot be served by the CPU build: their code imports transformers' Pixtral
  image processor, which needs torchvision, whose wheel does not load against the pinned torch.)

The BERT tokenizer frames a text as ``[CLS] text [SEP]`` and a (query, document) pair as
``[CLS] query [SEP] document [SEP]`` (token types 0 then 1), as BERT's own does.

Run with the engine's Python (it needs ``torch``, ``transformers`` and ``tokenizers``)::

    python scripts/engines/make_tiny_model.py DIR [EMBED_DIR RERANK_DIR [VLM_DIR]]

Shapes are chosen for vLLM's CPU build: hidden 128 with 2 heads gives head_dim 64 (vLLM's CPU
attention rejects head_dim 16); 2048 positions so prompts of 1,900 tokens fit. The tokenizer is
byte-level BPE (every string encodes; corpus words merge into one or a few tokens, so a word is
not a token, as with real models). The same seed gives the same tokenizer and weights.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "make_tiny_embedder",
    "make_tiny_model",
    "make_tiny_reranker",
    "make_tiny_vlm",
]

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
_BERT_SPECIAL = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]


def _bpe(seed: int, special: list[str]) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on a corpus drawn from ``seed``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rnd = random.Random(seed)  # noqa: S311 - a corpus, not a secret
    corpus = [" ".join(rnd.choice(_WORDS) for _ in range(30)) for _ in range(2000)]
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def _chat_tokenizer(seed: int, extra: tuple[str, ...] = ()) -> Any:
    """The chat models' tokenizer: ``<s>`` first, the chat template; ``extra`` special tokens
    (``<pad>`` among them becomes the pad token)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = _bpe(seed, [*_SPECIAL, *extra])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    special = {"bos_token": "<s>", "eos_token": "</s>"}  # token names, not secrets (S106)
    if "<pad>" in extra:
        special["pad_token"] = "<pad>"  # noqa: S105 - a token name
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _text_dims(fast: Any, max_positions: int) -> dict[str, Any]:
    """A chat model's language-model shape: 2 layers, hidden 128, 2 heads of 64."""
    return {
        "vocab_size": len(fast),
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": max_positions,
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
    }


def make_tiny_model(out: Path, *, seed: int = 0, max_positions: int = 2048) -> int:
    """Write the model and tokenizer to ``out``; returns the vocabulary size."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    fast = _chat_tokenizer(seed)
    fast.save_pretrained(str(out))
    cfg = LlamaConfig(
        **_text_dims(fast, max_positions),
        intermediate_size=256,
        num_key_value_heads=1,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(str(out), safe_serialization=True)
    return len(fast)


def _bert(out: Path, *, seed: int, classifier: bool, max_positions: int) -> int:
    import torch
    from tokenizers import processors
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertModel,
        PreTrainedTokenizerFast,
    )

    out.mkdir(parents=True, exist_ok=True)
    tok = _bpe(seed, _BERT_SPECIAL)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    names = ("pad", "cls", "sep", "unk", "mask")
    special = {f"{n}_token": t for n, t in zip(names, _BERT_SPECIAL, strict=True)}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_positions, **special)
    fast.save_pretrained(str(out))
    cfg = BertConfig(
        vocab_size=len(fast),
        hidden_size=128,  # 2 heads of 64, as for the chat model
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=max_positions,
        type_vocab_size=2,
        pad_token_id=fast.pad_token_id,
        num_labels=1,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(cfg) if classifier else BertModel(cfg)
    model.save_pretrained(str(out), safe_serialization=True)
    return len(fast)


def make_tiny_embedder(out: Path, *, seed: int = 0, max_positions: int = 512) -> int:
    """A ``BertModel`` and its tokenizer in ``out``; returns the vocabulary size."""
    return _bert(out, seed=seed, classifier=False, max_positions=max_positions)


def make_tiny_reranker(out: Path, *, seed: int = 0, max_positions: int = 512) -> int:
    """A one-label ``BertForSequenceClassification`` (a cross-encoder) in ``out``."""
    return _bert(out, seed=seed, classifier=True, max_positions=max_positions)


def make_tiny_vlm(out: Path, *, seed: int = 0, max_positions: int = 2048) -> int:
    """A BLIP-2 (one image a prompt, 8 image tokens) and its processor in ``out``."""
    import torch
    from transformers import (
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        Blip2QFormerConfig,
        Blip2VisionConfig,
        OPTConfig,
    )
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    out.mkdir(parents=True, exist_ok=True)
    fast = _chat_tokenizer(seed, ("<image>", "<pad>"))
    # the PIL image processor: the default one needs torchvision, which the CPU build lacks
    image = BlipImageProcessorPil(size={"height": 64, "width": 64})
    proc = Blip2Processor(image_processor=image, tokenizer=fast, num_query_tokens=8)
    proc.chat_template = CHAT_TEMPLATE
    proc.save_pretrained(str(out))
    width = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2}
    vision = Blip2VisionConfig(num_hidden_layers=2, image_size=64, patch_size=16, **width)
    qformer = Blip2QFormerConfig(
        num_hidden_layers=2, encoder_hidden_size=128, vocab_size=len(fast), **width
    )
    text = OPTConfig(
        **_text_dims(fast, max_positions),
        ffn_dim=256,
        word_embed_proj_dim=128,
        pad_token_id=fast.pad_token_id,
    )
    cfg = Blip2Config(
        vision_config=vision.to_dict(),
        qformer_config=qformer.to_dict(),
        text_config=text.to_dict(),
        num_query_tokens=8,
        image_token_index=fast.convert_tokens_to_ids("<image>"),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    Blip2ForConditionalGeneration(cfg).save_pretrained(str(out), safe_serialization=True)
    return len(fast)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4, 5):
        sys.exit("usage: make_tiny_model.py DIR [EMBED_DIR RERANK_DIR [VLM_DIR]]")
    print(f"tiny model in {sys.argv[1]}: vocab {make_tiny_model(Path(sys.argv[1]))}")
    makers = (make_tiny_embedder, make_tiny_reranker, make_tiny_vlm)
    for make, d in zip(makers, sys.argv[2:], strict=False):
        print(f"tiny {make.__name__[10:]} in {d}: vocab {make(Path(d))}")
