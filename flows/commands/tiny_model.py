"""``rlhfless tiny-model``: write a tiny, complete Hugging Face model folder (no download).

For trying ``model.path`` and the data pipeline on a laptop, and for benchmarks: a Qwen2,
Llama or Mistral model with random weights and a trained byte-level BPE tokenizer (see
``flows.commands.tiny_model_dir``). The default is the Qwen2 shape: ``pad_token_id: null``, no pad
token, two EOS ids and a ChatML template. ``--reward`` writes a reward model of the same shape
(``<Arch>ForSequenceClassification``, one label) for ``reward.models``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder to write: new or empty, or with --force any")
    parser.add_argument("--force", action="store_true",
                        help="replace a non-empty --out whole (nothing that was in it stays)")
    parser.add_argument("--arch", default="qwen2", choices=("qwen2", "llama", "mistral"))
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="embedding rows (default: the tokenizer's size rounded up to 64), e.g. 151936")
    parser.add_argument("--tokenizer-vocab", type=int, default=512, help="learned BPE tokens (default 512)")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-kv-heads", type=int, default=2)
    parser.add_argument("--max-positions", type=int, default=512)
    parser.add_argument("--untied", action="store_true", help="a separate output head (default: tied embeddings)")
    parser.add_argument("--pad-token", default=None,
                        help="a pad token, e.g. '<|endoftext|>' or '<pad>' (default: none, pad_token_id null)")
    parser.add_argument("--eos-token", dest="eos_tokens", action="append", default=None,
                        help="an EOS token (repeatable; the first is the tokenizer's eos_token)")
    parser.add_argument("--no-chat-template", action="store_true", help="no ChatML tokens and template")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--reward", action="store_true",
                        help="a reward model (sequence classification, one label) for reward.models")


def run(args: argparse.Namespace) -> int:
    for flag in ("vocab_size", "tokenizer_vocab", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                 "max_positions"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} {value}: must be >= 1")
    if args.hidden_size % args.num_heads or args.num_heads % args.num_kv_heads:
        raise ValueError(f"--hidden-size {args.hidden_size}, --num-heads {args.num_heads}, --num-kv-heads "
                         f"{args.num_kv_heads}: heads must divide the width and kv heads the heads")
    if (args.hidden_size // args.num_heads) % 2:  # rotary embeddings rotate pairs of a head's dimensions
        raise ValueError(f"--hidden-size {args.hidden_size} / --num-heads {args.num_heads} gives heads of "
                         f"{args.hidden_size // args.num_heads} dimensions; rotary embeddings need an even number")
    if args.tokenizer_vocab < 257:
        raise ValueError(f"--tokenizer-vocab {args.tokenizer_vocab}: a byte-level BPE needs > 256 tokens")
    out = _check_out(Path(args.out), args.force)
    from flows.commands.tiny_model_dir import write_tiny_model_dir

    # Written beside --out, then renamed into place: a failure part-way (a bad flag the writer
    # finds, a full disk) leaves --out as it was, and a replaced folder keeps nothing old.
    staging = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = _beside(out, "tiny-model")
        staging.mkdir()  # as --out itself would be made: its mode from the umask
        info = write_tiny_model_dir(
            staging, args.arch, vocab_size=args.vocab_size, tokenizer_vocab=args.tokenizer_vocab,
            hidden_size=args.hidden_size, num_layers=args.num_layers, num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads, max_positions=args.max_positions,
            tie_word_embeddings=not args.untied, pad_token=args.pad_token, eos_tokens=args.eos_tokens,
            chat_template=not args.no_chat_template, seed=args.seed, reward=args.reward)
        _move_into_place(staging, out)
    except OSError as exc:  # what the checks could not foresee (a read-only file system, a full disk)
        raise ValueError(f"--out {str(out)!r} cannot be written ({exc.strerror or exc}); pass a folder path you "
                         "can write") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    print(json.dumps({"path": str(out), "arch": info.arch, "vocab_size": info.vocab_size,
                      "tokenizer_size": info.tokenizer_size, "pad_token_id": info.pad_token_id,
                      "eos_token_ids": list(info.eos_token_ids)}))
    return 0


def _beside(out: Path, what: str) -> Path:
    """A hidden, unused name in ``out``'s folder."""
    return out.parent / f".{out.name}.{what}-{secrets.token_hex(6)}"


def _move_into_place(staging: Path, out: Path) -> None:
    """Rename the written folder ``staging`` to ``out``, replacing what ``out`` held (the old
    folder is renamed aside first and deleted once the new one is in place)."""
    if not out.exists():
        staging.rename(out)
        return
    old = _beside(out, "replaced")
    out.rename(old)
    try:
        staging.rename(out)
    except OSError:
        old.rename(out)  # put it back: a failed replace changes nothing
        raise
    shutil.rmtree(old, ignore_errors=True)


def _check_out(out: Path, force: bool = False) -> Path:
    """``--out`` as a folder this user can create or fill (a non-empty one only with ``force``);
    ValueError naming it otherwise."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; pass a folder path")
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if entries and not force:
        raise ValueError(f"--out {str(out)!r} is not empty ({len(entries)} entries, e.g. {entries[0]!r}); pass a "
                         "new or empty folder, or --force to replace the folder whole")
    blocked = next((p for p in out.absolute().parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise ValueError(f"--out {str(out)!r} is inside {str(blocked)!r}, which is a file, not a folder; pass a "
                         "folder path whose parents are folders")
    home = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    if not os.access(home, os.W_OK | os.X_OK):
        raise ValueError(f"--out {str(out)!r}: {str(home)!r} cannot be written by this user; pass a folder path "
                         "you can write")
    return out

