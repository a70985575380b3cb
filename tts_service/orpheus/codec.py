"""SNAC decoding over sliding windows, batched across streams.

SNAC's decoder is non-causal: a frame's codes shape about +-4600 samples (~2.2 frames) around
it. A window therefore decodes ``left`` frames of context before and ``right`` after the frames
it keeps; the right context is latency (a frame is heard only once ``right`` more frames exist),
the left context is compute only. ``tests/orpheus/test_codec.py`` measures the seam against a
whole-utterance decode; the defaults (left 3, right 2) keep it small next to the signal.

The first windows keep 1 frame, later ones 2, 4, then 8: first audio needs only ``1 + right``
frames, and later windows spread the context overhead over more frames. A segment's last window
keeps everything left, without right context.

Every stream's ready window of one tick goes into one decoder call per distinct window length
(in steady state all windows have the same length). ``NoiseBlock`` draws fresh noise per call,
as the checkpoint was trained to; decoding is therefore not bit-reproducible unless seeded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .config import SAMPLES_PER_FRAME
from .tokens import frames_to_levels

DEFAULT_LEFT = 3
DEFAULT_RIGHT = 2
DEFAULT_CHUNKS = (1, 2, 4, 8)


@dataclass(slots=True)
class _Codes:
    frames: list[list[int]] = field(default_factory=list)  # [n][7] codes of the current segment
    emitted: int = 0  # frames whose audio has been produced
    windows: int = 0  # windows emitted in this segment (picks the chunk size)
    finished: bool = False


@dataclass(frozen=True, slots=True)
class CodecWindow:
    """Decode frames [lo, hi) of ``slot`` and keep the audio of frames [keep_lo, keep_hi)."""

    slot: int
    codes: np.ndarray  # [hi - lo, 7]
    lo: int
    hi: int
    keep_lo: int
    keep_hi: int
    last: bool  # the segment's final window


class WindowedCodec:
    """Per-slot code buffers plus the batched decoder. Pure compute, single-threaded."""

    def __init__(
        self,
        snac,
        *,
        device: str | torch.device = "cpu",
        left: int = DEFAULT_LEFT,
        right: int = DEFAULT_RIGHT,
        chunks: tuple[int, ...] = DEFAULT_CHUNKS,
    ) -> None:
        self.snac = snac
        self.device = torch.device(device)
        self.left, self.right, self.chunks = left, right, tuple(chunks)
        self._slots: dict[int, _Codes] = {}

    # ------------------------------------------------------------ buffers
    def reset(self, slot: int) -> None:
        self._slots[slot] = _Codes()

    def push(self, slot: int, codes: list[int]) -> None:
        self._slots.setdefault(slot, _Codes()).frames.append(codes)

    def finish(self, slot: int) -> None:
        self._slots.setdefault(slot, _Codes()).finished = True

    def pending_frames(self, slot: int) -> int:
        s = self._slots.get(slot)
        return 0 if s is None else len(s.frames) - s.emitted

    def ready(self) -> list[CodecWindow]:
        """Windows that can be decoded now, at most one per slot."""
        out = []
        for slot, s in self._slots.items():
            n = len(s.frames)
            if s.emitted >= n:
                continue
            chunk = self.chunks[min(s.windows, len(self.chunks) - 1)]
            e = s.emitted
            if s.finished:
                keep_hi, hi, last = n, n, True
            elif n - e >= chunk + self.right:
                keep_hi, hi, last = e + chunk, e + chunk + self.right, False
            else:
                continue
            lo = max(0, e - self.left)
            out.append(CodecWindow(slot, np.asarray(s.frames[lo:hi], dtype=np.int64), lo, hi, e, keep_hi, last))
        return out

    def commit(self, w: CodecWindow) -> None:
        s = self._slots[w.slot]
        s.emitted = w.keep_hi
        s.windows += 1
        if w.last:
            del s.frames[:]  # the segment is over; the slot's next segment starts empty
            s.emitted = s.windows = 0
            s.finished = False

    # ------------------------------------------------------------ decoding
    @torch.inference_mode()
    def decode_codes(self, frames: np.ndarray) -> np.ndarray:
        """frames [B, n, 7] -> audio [B, 2048 * n] float32 (one decoder call)."""
        levels = [torch.from_numpy(np.ascontiguousarray(lv)).to(self.device) for lv in frames_to_levels(frames)]
        audio = self.snac.decode(levels)  # [B, 1, 2048 n]
        return audio[:, 0].float().cpu().numpy()

    def decode(self, windows: list[CodecWindow]) -> list[np.ndarray]:
        """Audio of each window's kept frames, in order; one call per distinct window length."""
        out: list[np.ndarray | None] = [None] * len(windows)
        groups: dict[int, list[int]] = {}
        for i, w in enumerate(windows):
            groups.setdefault(w.hi - w.lo, []).append(i)
        for members in groups.values():
            audio = self.decode_codes(np.stack([windows[i].codes for i in members]))
            for row, i in enumerate(members):
                w = windows[i]
                a, b = (w.keep_lo - w.lo) * SAMPLES_PER_FRAME, (w.keep_hi - w.lo) * SAMPLES_PER_FRAME
                out[i] = np.clip(audio[row, a:b], -1.0, 1.0)
        return out  # type: ignore[return-value]

    def decode_whole(self, frames: np.ndarray) -> np.ndarray:
        """The reference: one call over a whole segment's frames [n, 7]."""
        return self.decode_codes(np.asarray(frames)[None])[0]

    def stream(self, frames: np.ndarray) -> np.ndarray:
        """Decode [n, 7] frames as the engine would, a frame at a time (tests, seam measurement)."""
        slot = -1
        self.reset(slot)
        parts = []
        for i, f in enumerate(np.asarray(frames).tolist()):
            self.push(slot, f)
            if i == len(frames) - 1:
                self.finish(slot)
            for w in self.ready():
                if w.slot == slot:
                    parts.append(self.decode([w])[0])
                    self.commit(w)
        del self._slots[slot]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
