"""Token ids <-> SNAC codes, and prompt building.

Orpheus writes one 85 ms audio frame as 7 tokens. Token ``k`` of a frame (k = 0..6) is
``AUDIO_BASE + k * 4096 + code``, code 0..4095, and the 7 codes fill SNAC's three levels:
level 0 <- k=0, level 1 <- k=1,4, level 2 <- k=2,3,5,6 (depth first through the hierarchy).

The phase of a token is read from its id range, never from a running count: a counter that
drifts by one silently shuffles every later code (a known bug of the reference decoder), while
``(id - AUDIO_BASE) // 4096 == k`` fails loudly on the first wrong token. Code 0 is a valid code
(the reference decoder drops it, shifting everything after).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np

CUSTOM_BASE = 128256  # <custom_token_N> = CUSTOM_BASE + N
BOS = 128000  # <|begin_of_text|>
EOT = 128009  # <|eot_id|>
START_OF_SPEECH = 128257
END_OF_SPEECH = 128258  # the stop token
START_OF_HUMAN = 128259
END_OF_HUMAN = 128260
START_OF_AI = 128261
END_OF_AI = 128262
PAD = 128263
AUDIO_BASE = 128266
CODEBOOK = 4096
FRAME = 7
AUDIO_END = AUDIO_BASE + FRAME * CODEBOOK  # 156938, one past the last audio id

VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")


class PhaseError(ValueError):
    """A token is not the audio token expected at this position of the frame."""


def audio_id(code: int, k: int) -> int:
    if not 0 <= code < CODEBOOK or not 0 <= k < FRAME:
        raise ValueError(f"code {code} / position {k} out of range")
    return AUDIO_BASE + k * CODEBOOK + code


def code_of(token: int, k: int) -> int:
    """The SNAC code carried by ``token`` at frame position ``k``; raises :class:`PhaseError`."""
    off = token - AUDIO_BASE
    if off < 0 or off >= FRAME * CODEBOOK:
        raise PhaseError(f"token {token} is not an audio token (expected position {k} of a frame)")
    if off // CODEBOOK != k:
        raise PhaseError(f"token {token} belongs to frame position {off // CODEBOOK}, expected {k}")
    return off % CODEBOOK


def frame_codes(tokens: Sequence[int]) -> list[int]:
    """7 consecutive audio tokens -> their 7 codes (positions checked)."""
    if len(tokens) != FRAME:
        raise ValueError(f"a frame has {FRAME} tokens, got {len(tokens)}")
    return [code_of(t, k) for k, t in enumerate(tokens)]


def frame_ids(codes: Sequence[int]) -> list[int]:
    return [audio_id(c, k) for k, c in enumerate(codes)]


def frames_to_levels(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[..., n, 7] codes -> SNAC levels [..., n], [..., 2n], [..., 4n]."""
    f = np.asarray(frames)
    lead = f.shape[:-2]
    n = f.shape[-2]
    l0 = f[..., 0]
    l1 = f[..., [1, 4]].reshape(*lead, 2 * n)
    l2 = f[..., [2, 3, 5, 6]].reshape(*lead, 4 * n)
    return l0, l1, l2


def levels_to_frames(l0: np.ndarray, l1: np.ndarray, l2: np.ndarray) -> np.ndarray:
    """Inverse of :func:`frames_to_levels` (for round-trip tests and encoding reference audio)."""
    n = l0.shape[-1]
    lead = l0.shape[:-1]
    a = np.asarray(l1).reshape(*lead, n, 2)
    b = np.asarray(l2).reshape(*lead, n, 4)
    return np.stack([l0, a[..., 0], b[..., 0], b[..., 1], a[..., 1], b[..., 2], b[..., 3]], axis=-1)


# ---------------------------------------------------------------------- prompts
class HashTokenizer:
    """Stand-in text tokenizer for ``--random-weights`` (no tokenizer.json to read).

    One id per word or punctuation mark, hashed into the text vocabulary: prompts get about the
    length a BPE tokenizer would give them, so prefill costs are realistic.
    """

    _PIECES = re.compile(r"\w+|[^\w\s]")

    def encode_ids(self, text: str) -> list[int]:
        return [zlib.crc32(p.encode()) % 100000 + 1000 for p in self._PIECES.findall(text)]


class HFTokenizer:
    """A ``tokenizer.json`` read with the ``tokenizers`` package (no transformers needed)."""

    def __init__(self, path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))

    def encode_ids(self, text: str) -> list[int]:
        # BOS is placed by build_prompt: the tokenizer's own post-processor must not add another.
        return self._tok.encode(text, add_special_tokens=False).ids

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


def build_prompt(tokenizer, text: str, voice: str | None) -> list[int]:
    """``<human> <bos> "{voice}: {text}" <eot> </human> <ai> <speech>``: the model speaks next."""
    body = f"{voice}: {text}" if voice else text
    return [START_OF_HUMAN, BOS, *tokenizer.encode_ids(body), EOT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]
