"""The TTS server's memory over many long replies: does it level off, or grow with every call?

    .venv/bin/python scripts/tts_soak.py --replies 40 --json out/tts_soak.json   # ~6 min

Why: a long call through the demo grows its processes' memory a few MB a turn
(``scripts/agent_calls.py --turns``, which charges it per part), and a growth is only a leak if it
does not stop. This starts the server as the demo does (``python -m tts_service``, its own process),
asks it for ``--replies`` long replies one after another over ``POST /v1/tts`` (texts of 6-14
sentences of 5-28 words, drawn from the long call's asks with a fixed seed), and prints the server's
RSS after each, with the audio length and the time it took.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # support.*, tts_service

from support.callers import LONG_ASKS


def replies(n: int, seed: int = 7) -> list[str]:
    """``n`` reply-like texts: sentences cut from the long asks' words (no model needed to make them)."""
    words = " ".join(LONG_ASKS).replace("?", ".").split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        sentences = []
        for _ in range(rng.randint(6, 14)):
            k = rng.randint(5, 28)
            i = rng.randrange(0, len(words) - k)
            sentences.append(" ".join(words[i : i + k]).rstrip(".,") + ".")
        out.append(" ".join(sentences))
    return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=40, help="long replies, one after another (default 40)")
    parser.add_argument("--json", type=Path, help="write the per-reply figures here")
    args = parser.parse_args(argv)
    if not 1 <= args.replies <= 1000:
        parser.error("--replies must be between 1 and 1000")
    from tts_service.localproc import ChildServer, StartError, free_port

    port = free_port()
    try:
        server = ChildServer(
            ["-m", "tts_service", "--port", str(port), "--log-level", "WARNING"], what="the TTS server", port=port
        ).start()
    except StartError as exc:
        raise SystemExit(f"tts_soak: {exc}") from None
    rows = [{"reply": 0, "rss_mb": round(rss_mb(server.proc.pid), 1)}]
    print(f"idle: RSS {rows[0]['rss_mb']:.0f} MB", flush=True)
    try:
        for i, text in enumerate(replies(args.replies), 1):
            t0 = time.perf_counter()
            body = json.dumps({"text": text}).encode()
            req = urllib.request.Request(
                f"{server.base}/v1/tts", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=300) as resp:
                    nbytes = len(resp.read())
            except (urllib.error.URLError, OSError) as exc:
                raise SystemExit(f"tts_soak: reply {i} failed: {exc}") from None
            row = {
                "reply": i,
                "chars": len(text),
                "wav_bytes": nbytes,
                "seconds": round(time.perf_counter() - t0, 2),
                "rss_mb": round(rss_mb(server.proc.pid), 1),
            }
            rows.append(row)
            print(
                f"reply {i}/{args.replies}: {len(text)} chars in {row['seconds']} s, RSS {row['rss_mb']:.0f} MB",
                flush=True,
            )
    finally:
        server.stop()
    half = rows[len(rows) // 2]["rss_mb"]
    print(f"RSS: idle {rows[0]['rss_mb']:.0f}, after reply 1 {rows[1]['rss_mb']:.0f}, halfway {half:.0f}, "
          f"last {rows[-1]['rss_mb']:.0f} MB")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
