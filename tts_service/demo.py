"""``make demo``: start the real server, stream a paragraph into ``out/demo.wav``, report figures.

The server runs as its own process (exactly as ``streamvox serve`` would), so what the demo
measures is what a client on this machine gets: time to first audio byte over the WebSocket,
and the real-time factor of an unpaced render. A paced render then shows the same TTFB while
audio arrives in step with playback.
"""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.request
from pathlib import Path

from .cli import speak_to_wav
from .client import TTSClient
from .localproc import ChildServer, StartError

PARAGRAPH = (
    "Welcome to streamvox. This voice is generated while you listen: the first sound leaves the server "
    "after a few tens of milliseconds, whatever the length of the text. A voice agent built on it can stop "
    "mid-word when the caller talks over it, and carry on with the next turn on the same connection."
)


async def _run(url: str, out_dir: Path) -> None:
    async with TTSClient(url) as client:
        fast = await speak_to_wav(client, PARAGRAPH, out_dir / "demo.wav", pace=False)
        paced = await speak_to_wav(client, PARAGRAPH, out_dir / "demo-paced.wav", pace=True)
    print(f"\nwrote {out_dir / 'demo.wav'}: {fast['audio_s']:.1f} s of speech")
    print(
        f"  unpaced: TTFB {fast['ttfb_ms']:.0f} ms, real-time factor {fast['rtf']:.3f} "
        f"({1 / fast['rtf']:.1f}x faster than real time)"
    )
    print(
        f"  paced:   TTFB {paced['ttfb_ms']:.0f} ms, audio delivered in step with playback "
        f"({paced['wall_s']:.1f} s wall for {paced['audio_s']:.1f} s of audio)"
    )


def main() -> int:
    server = ChildServer.tts(output="inherit")  # the user sees the server's own messages
    out_dir = Path(os.environ.get("STREAMVOX_DEMO_OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"starting streamvox on {server.ws_url} ...", flush=True)
    try:
        try:
            server.start(120.0)
        except StartError as exc:
            raise SystemExit(f"streamvox demo: {exc}; see the server's output above") from None
        asyncio.run(_run(server.ws_url, out_dir))
        with urllib.request.urlopen(f"{server.base}/metrics", timeout=5) as resp:
            lines = [ln for ln in resp.read().decode().splitlines() if ln.startswith("streamvox_real_time_factor")]
        if lines:
            print(f"  server: {lines[0]}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
