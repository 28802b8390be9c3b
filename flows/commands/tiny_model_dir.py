"""Tiny but complete Hugging Face model folders (Qwen2, Llama, Mistral) for tests, docs and benchmarks.

``write_tiny_model_dir`` writes what a real checkpoint ships, so code paths that only real
models exercise run on two CPU cores in seconds:

* ``config.json`` of the architecture, with ``pad_token_id`` written out (``null`` when the
  model has no pad token, as Qwen2 and Llama checkpoints do) and ``eos_token_id`` an int
  (Qwen2 style) or, for Llama/Mistral with several EOS ids, a list (Llama 3.1 style);
* ``model.safetensors``: random weights from ``torch.manual_seed(seed)``, tied or untied;
* ``generation_config.json`` with the *list* of EOS ids, as real instruct models have;
* a byte-level BPE tokenizer trained with the ``tokenizers`` library on a small built-in
  corpus (GSM8K-style word problems ending in ``#### N``, chat-like text, numbers), saved as
  ``tokenizer.json`` + ``tokenizer_config.json`` (with a Qwen-style ChatML template inside
  ``tokenizer_config.json`` when asked). Special tokens are appended *after* the learned
  vocabulary, like Qwen's ``<|endoftext|>`` at 151643, and the embedding matrix may be larger
  than the tokenizer (``vocab_size``), like Qwen's 151,936 rows for 151,665 tokens.

Everything is deterministic for a seed: the corpus is generated from a fixed seed and the BPE
trainer runs on one thread, so two calls write byte-identical files.

This is a tool of the CLI (``rlhfless tiny-model``), the tests and the benchmarks, not of the
action runtime: no action imports it and the runtime images do not ship it. The campaign's
embedded default model (``model.path`` unset) is built inside ``prepare`` by
``actions/models/modeling.py`` instead.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ARCHS = ("qwen2", "llama", "mistral")
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Special tokens of each architecture's tokenizer (the chat pair is added with chat_template).
_SPECIALS = {"qwen2": ["<|endoftext|>"], "llama": ["<s>", "</s>"], "mistral": ["<s>", "</s>"]}
_CHAT = ["<|im_start|>", "<|im_end|>"]
_BOS = {"qwen2": None, "llama": "<s>", "mistral": "<s>"}
_NAMES = ["Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kim", "Lena", "Max", "Nia"]
_ITEMS = ["apples", "books", "coins", "eggs", "pens", "stamps", "cookies", "marbles", "shells", "cards"]


@dataclass(frozen=True)
class TinyModelInfo:
    """What was written: the folder and the token ids a test needs to reason about it."""

    path: Path
    arch: str
    vocab_size: int  # rows of the embedding matrix
    tokenizer_size: int  # tokens the tokenizer knows (<= vocab_size)
    pad_token_id: int | None  # None: no pad token anywhere (config.json says null)
    eos_token_ids: tuple[int, ...]  # generation_config.json's list, first = tokenizer's eos_token
    bos_token_id: int | None


def build_corpus(num_problems: int = 600, seed: int = 0) -> list[str]:
    """Texts the tokenizer is trained on: GSM8K-style problems with worked answers, chat turns,
    and plain numbers. Fixed for a seed."""
    rng = random.Random(seed)
    texts = []
    for _ in range(num_problems):
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b, c = rng.randint(2, 99), rng.randint(2, 60), rng.randint(1, 30)
        total = a + b - min(c, a + b)
        texts.append(f"{name} has {a} {item}. {name} buys {b} more and gives away {min(c, a + b)}. "
                     f"How many {item} does {name} have now?\n"
                     f"{name} has {a} + {b} = {a + b} {item}. Then {a + b} - {min(c, a + b)} = {total}.\n"
                     f"#### {total}")
        texts.append(f"Question: what is {a} times {c}? Answer: {a} * {c} = {a * c}. The answer is {a * c}.")
        texts.append(f"user: Please solve {a} + {b}.\nassistant: Sure! {a} + {b} = {a + b}. #### {a + b}")
    texts += [" ".join(str(rng.randint(0, 10_000)) for _ in range(20)) for _ in range(50)]
    texts += ["You are a helpful assistant. Think step by step, then give the final answer after ####.",
              "The answer is \\boxed{42}. That costs $1,000.00 in total."]
    return texts


def train_bpe_tokenizer(specials: Sequence[str], *, num_merges_vocab: int, seed: int = 0):
    """A byte-level BPE ``tokenizers.Tokenizer`` with ``num_merges_vocab`` learned tokens
    (256 bytes + merges), then ``specials`` appended after them."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread: a reproducible merge order
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=num_merges_vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(build_corpus(seed=seed), trainer=trainer)
    tok.add_special_tokens(list(specials))
    return tok


def _config(arch: str, *, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
            intermediate_size: int, max_positions: int, tie: bool, pad_id: int | None, eos_ids: list[int],
            bos_id: int | None):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig, "mistral": MistralConfig}[arch]
    eos = eos_ids[0] if arch == "qwen2" or len(eos_ids) == 1 else list(eos_ids)
    return cls(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
               num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
               max_position_embeddings=max_positions, tie_word_embeddings=tie, pad_token_id=pad_id,
               eos_token_id=eos, bos_token_id=bos_id)


def write_tiny_model_dir(
    path: str | os.PathLike[str], arch: str = "qwen2", *, vocab_size: int | None = None, tokenizer_vocab: int = 512,
    hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
    intermediate_size: int | None = None, max_positions: int = 512, tie_word_embeddings: bool = True,
    pad_token: str | None = None, eos_tokens: Sequence[str] | None = None, chat_template: bool = True,
    seed: int = 0, reward: bool = False,
) -> TinyModelInfo:
    """Write a complete local Hugging Face causal-LM folder at ``path`` (created if needed).

    Args:
        arch: ``qwen2`` | ``llama`` | ``mistral``.
        vocab_size: embedding rows; default: the tokenizer's size rounded up to a multiple of 64
            (so, as in Qwen, some ids have no token). Must be >= the tokenizer's size.
        tokenizer_vocab: learned BPE tokens (256 byte tokens + merges), before special tokens.
        num_kv_heads: key/value heads (grouped-query attention when < ``num_heads``).
        tie_word_embeddings: share the input embedding with the output head.
        pad_token: a special token to use as padding (e.g. ``<|endoftext|>``, or a new one such
            as ``<pad>``, which is then added); None: no pad token, ``pad_token_id: null``.
        eos_tokens: special tokens that end a sample, the first being the tokenizer's
            ``eos_token``; default with a chat template: ``<|im_end|>`` and the architecture's end
            token (``<|endoftext|>`` or ``</s>``), two EOS ids as in Qwen2.5-Instruct; without:
            the end token alone.
        chat_template: add ``<|im_start|>``/``<|im_end|>`` and a ChatML template.
        seed: weights' random seed (the tokenizer does not depend on it).
        reward: a reward model instead: ``<Arch>ForSequenceClassification`` with one label (its
            logit is the score), no generation config, and the end token as pad token unless
            ``pad_token`` names one (a batch of scores needs padding).
    Returns:
        a ``TinyModelInfo`` with the ids that were assigned.
    Raises:
        ValueError: an unknown arch, an EOS/pad token the tokenizer lacks, or a vocab_size
            smaller than the tokenizer.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r} is not supported; use one of {', '.join(ARCHS)}")
    specials, eos_tokens, pad_token = _special_tokens(arch, chat_template, pad_token, eos_tokens, reward)
    tok = train_bpe_tokenizer(specials, num_merges_vocab=tokenizer_vocab)
    size = tok.get_vocab_size()
    vocab_size = vocab_size or 64 * -(-size // 64)
    if vocab_size < size:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer's {size} tokens")
    eos_ids = [tok.token_to_id(t) for t in eos_tokens]
    pad_id = tok.token_to_id(pad_token) if pad_token is not None else None
    bos_id = tok.token_to_id(_BOS[arch]) if _BOS[arch] else None
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)

    _save_tokenizer(root, tok, arch, eos_tokens[0], pad_token, max_positions, chat_template)
    config = _config(arch, vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                     num_heads=num_heads, num_kv_heads=num_kv_heads,
                     intermediate_size=intermediate_size or 4 * hidden_size, max_positions=max_positions,
                     tie=tie_word_embeddings, pad_id=pad_id, eos_ids=eos_ids, bos_id=bos_id)
    _save_model(root, config, seed=seed, reward=reward, eos_ids=eos_ids, pad_id=pad_id, bos_id=bos_id)
    _rewrite_config(root, pad_id)
    return TinyModelInfo(root, arch, vocab_size, size, pad_id, tuple(eos_ids), bos_id)


def _special_tokens(arch: str, chat_template: bool, pad_token: str | None, eos_tokens: Sequence[str] | None,
                    reward: bool) -> tuple[list[str], list[str], str | None]:
    """``(specials, eos_tokens, pad_token)``: the special tokens appended after the learned
    vocabulary, and the EOS and pad tokens with their defaults filled in (see
    :func:`write_tiny_model_dir`). Raises ValueError for an EOS token that is not among them."""
    if reward and pad_token is None:
        pad_token = _SPECIALS[arch][-1]
    specials = list(_SPECIALS[arch]) + (_CHAT if chat_template else [])
    if eos_tokens is None:
        end = _SPECIALS[arch][-1]  # <|endoftext|> or </s>
        eos_tokens = ["<|im_end|>", end] if chat_template else [end]
    if pad_token is not None and pad_token not in specials:
        specials.append(pad_token)
    missing = [t for t in eos_tokens if t not in specials]
    if missing:
        raise ValueError(f"eos_tokens {missing} are not special tokens of this tokenizer; use some of {specials}")
    return specials, list(eos_tokens), pad_token


def _save_model(root: Path, config, *, seed: int, reward: bool, eos_ids: list[int], pad_id: int | None,
                bos_id: int | None) -> None:
    """Random fp32 weights from ``torch.manual_seed(seed)`` saved as safetensors under ``root``: a
    one-label sequence classifier when ``reward``, else a causal LM with its generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, GenerationConfig

    from actions.models.export import give_usual_modes

    torch.manual_seed(seed)
    if reward:
        config.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
        (root / "generation_config.json").unlink(missing_ok=True)  # a causal LM's, left by an earlier write
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.generation_config = GenerationConfig(eos_token_id=list(eos_ids), pad_token_id=pad_id,
                                                   bos_token_id=bos_id, do_sample=True, temperature=0.7)
    model.save_pretrained(root, safe_serialization=True)
    give_usual_modes(root)  # safetensors writes the weights owner-only: unreadable to a serving user


def _save_tokenizer(root: Path, tok, arch: str, eos_token: str, pad_token: str | None, max_positions: int,
                    chat_template: bool) -> None:
    """The tokenizer's files under ``root``, as a fast tokenizer with the ChatML template when asked."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos_token, pad_token=pad_token,
                                   bos_token=_BOS[arch], unk_token=None, model_max_length=max_positions,
                                   clean_up_tokenization_spaces=False)
    fast.save_pretrained(root)
    _rewrite_tokenizer_config(root, CHATML_TEMPLATE if chat_template else None, pad_token)


def _rewrite_tokenizer_config(root: Path, template: str | None, pad_token: str | None) -> None:
    """The template inside tokenizer_config.json (as Qwen2.5 ships it) rather than in a separate
    ``chat_template.jinja``, and ``pad_token`` written out even when null."""
    cfg_file = root / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    (root / "chat_template.jinja").unlink(missing_ok=True)
    cfg.pop("chat_template", None)
    if template is not None:
        cfg["chat_template"] = template
    cfg["pad_token"] = pad_token
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # loads with transformers 4.x and 5.x alike
    cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _rewrite_config(root: Path, pad_id: int | None) -> None:
    """``pad_token_id`` explicitly (``null`` when absent): ``save_pretrained`` drops values equal
    to the defaults, and the null is exactly what real Qwen2/Llama checkpoints have."""
    cfg_file = root / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["pad_token_id"] = pad_id
    cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
