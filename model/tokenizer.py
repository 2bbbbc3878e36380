"""Tokenizers: a real checkpoint's own (Hugging Face, local files only) or a synthetic byte tokenizer."""

from __future__ import annotations

from pathlib import Path

from contracts import UsageError

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
_BYTES = 256


class SyntheticTokenizer:
    """Deterministic stand-in for models without tokenizer files: token id = UTF-8 byte value.

    Ids of 256 and above (random-weight models emit them) decode as "<id>"; it is labeled synthetic.
    """

    synthetic = True
    eos_token_id = None

    def __init__(self, vocab_size: int):
        if vocab_size < _BYTES:
            raise UsageError(
                f"a model without tokenizer files needs a vocabulary of at least {_BYTES} "
                f"tokens for the synthetic byte tokenizer, got {vocab_size}"
            )
        self.vocab_size = vocab_size
        self.name = f"synthetic-bytes-{vocab_size}"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        pieces, run = [], bytearray()
        for token in ids:
            if token < _BYTES:
                run.append(token)
                continue
            pieces.append(run.decode("utf-8", errors="replace"))
            pieces.append(f"<{token}>")
            run = bytearray()
        pieces.append(run.decode("utf-8", errors="replace"))
        return "".join(pieces)

    def get_vocab(self) -> dict[str, int]:
        return {f"<0x{byte:02X}>": byte for byte in range(_BYTES)} | {
            f"<{token}>": token for token in range(_BYTES, self.vocab_size)
        }


class HFTokenizer:
    """A checkpoint's Hugging Face tokenizer behind the same small interface as SyntheticTokenizer."""

    synthetic = False

    def __init__(self, folder: str | Path, name: str):
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.name = name
        self.vocab_size = len(self._tokenizer)
        self.eos_token_id = self._tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        """Token ids with the model's special prefix (e.g. Gemma's BOS), as the model expects."""
        return self._tokenizer.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab()


def load_tokenizer(folder: str | Path, name: str, vocab_size: int) -> HFTokenizer | SyntheticTokenizer:
    """The checkpoint's tokenizer (called `name`); a synthetic one when the folder has no tokenizer files."""
    if any((Path(folder) / file).exists() for file in _TOKENIZER_FILES):
        return HFTokenizer(folder, name)
    return SyntheticTokenizer(vocab_size)


def check_compatible(target_tok, draft_tok, target_vocab: int, draft_vocab: int) -> None:
    """Speculative decoding compares token ids, so target and draft must share vocabulary and tokenizer."""
    if target_vocab != draft_vocab:
        raise UsageError(f"target and draft vocabularies differ: {target_vocab} vs {draft_vocab} tokens")
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise UsageError(f"target and draft tokenizers differ: {target_tok.name} vs {draft_tok.name}")
