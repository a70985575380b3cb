"""One-shot synthesis over HTTP: the WAV streams in while it is generated.

Run a server first (``streamvox serve``: this program posts to http://127.0.0.1:8765/v1/tts), then
``python examples/http_oneshot.py "Hello there."``; it writes ``oneshot.wav`` (24 kHz) in the
current folder.
"""

import asyncio
import sys
import time

import aiohttp


async def main(text: str) -> None:
    async with aiohttp.ClientSession() as session:
        t0 = time.perf_counter()
        body = {"text": text, "encoding": "wav", "sample_rate": 24000}
        async with session.post("http://127.0.0.1:8765/v1/tts", json=body) as resp:
            resp.raise_for_status()
            with open("oneshot.wav", "wb") as out:
                first = True
                async for chunk in resp.content.iter_any():
                    if first:
                        print(f"first bytes after {1000 * (time.perf_counter() - t0):.0f} ms")
                        first = False
                    out.write(chunk)
    print("wrote oneshot.wav")


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "Hello there, this came over HTTP."))
