"""Compressed audio for the OpenAI speech endpoint: mp3, opus, aac, flac, streamed as generated.

The encoders are FFmpeg's (libmp3lame, libopus, FFmpeg's aac and flac) through PyAV (``av``, BSD,
maintained, binary wheels with FFmpeg inside). It comes with the ``pipecat`` and ``livekit``
extras (aiortc and livekit-agents need it) and alone with the ``formats`` extra. Without it the
server still serves ``pcm`` and ``wav``, and refuses the others with a 400 that says what to
install. Each PCM chunk is encoded and muxed at once, and whatever the muxer wrote is sent: the
first bytes leave with the first audio.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

# response_format -> (container, encoder, content type)
FORMATS: dict[str, tuple[str, str, str]] = {
    "mp3": ("mp3", "libmp3lame", "audio/mpeg"),
    "opus": ("ogg", "libopus", "audio/ogg"),
    "aac": ("adts", "aac", "audio/aac"),
    "flac": ("flac", "flac", "audio/flac"),
}


def available() -> str | None:
    """``None`` when the encoders can be used, else why not (for the 400 a client gets)."""
    try:
        import av  # noqa: F401
    except ImportError:
        return "this server has no audio encoder installed (pip install av, or streamvox[formats])"
    return None


class _Collect(io.RawIOBase):
    """A write-only file for the muxer: what it writes is taken after every chunk."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False  # a stream: muxers that would seek back (flac's header) write what they can

    def write(self, data) -> int:  # type: ignore[override]
        self.buf += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self.buf)
        self.buf.clear()
        return out


@dataclass
class Encoded:
    """One response's encoder: ``encode`` 16-bit mono PCM chunks, then ``finish`` once."""

    response_format: str
    sample_rate: int
    bit_rate: int | None = None  # bits per second; None: the encoder's default

    def __post_init__(self) -> None:
        import av

        container, codec, _ = FORMATS[self.response_format]
        self._av = av
        self._out = _Collect()
        self._container = av.open(self._out, mode="w", format=container)
        self._stream = self._container.add_stream(codec, rate=self.sample_rate, layout="mono")
        if self.bit_rate:
            self._stream.bit_rate = self.bit_rate

    @property
    def content_type(self) -> str:
        return FORMATS[self.response_format][2]

    def _mux(self, frame) -> bytes:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._out.take()

    def encode(self, pcm: bytes) -> bytes:
        if not pcm:
            return b""
        samples = np.frombuffer(pcm, dtype="<i2").reshape(1, -1)
        frame = self._av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        return self._mux(frame)

    def finish(self) -> bytes:
        tail = self._mux(None)
        self._container.close()
        return tail + self._out.take()

    def close(self) -> None:
        """Abandon the encoder (the client went away): free FFmpeg's state without writing more."""
        try:
            self._container.close()
        except Exception:  # closing a half-written container can fail; nothing is sent any more
            pass
