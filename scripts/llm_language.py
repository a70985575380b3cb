"""Which of the local LLM's replies come out in another language than English, with and without the nudge.

Why: asked about France, Spain or Germany, the demo's 135M model answered in French, Spanish or
German now and then ("L'capital de France est Paris."), its system prompt's "plain conversational
English" notwithstanding, and a call then stayed in that language. This replays the caller corpus's words (pauses
removed) and questions about other countries, each after the demo's system prompt and greeting,
plus a few two-turn calls, through one loaded model: every prompt once with each nudge (words read after every user
message, e.g. " Answer in English."), greedy, so the rows differ only by the nudge. Greedy is not
deterministic across runs here: the same words read with another cache state (another order of
prompts) can tip the first token, so compare rows of one run. A reply counts as foreign when at least 30 % of its first
12 words are function words of French, Spanish, German or Italian (a word list, not a model:
printed replies let you check it).

    python scripts/llm_language.py                 # " Answer in English." against none
    python scripts/llm_language.py --nudge "" " Answer in English." " (in English)"
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.local_llm import LLMLoadError, LocalLLM  # noqa: E402
from pipelines.persona import GREETING, SYSTEM_PROMPT  # noqa: E402
from support.callers import SCRIPTS  # noqa: E402

FOREIGN_WORDS = set(
    # French, Spanish, German, Italian function words that are not English words
    "je tu il elle nous vous ils elles le les une des du est sont suis pas que qui avec dans pour mais cette "
    "ces très être au aux leur ne bien sûr bonjour merci bienvenue "
    "el los las es y del por para con una muy pero está "
    "der das und ist ein eine nicht ich sie wir mit von zu den dem "
    "di della è sono per non che lo gli".split()
)
ABROAD = [
    "What's the capital of France?",
    "Tell me about Paris.",
    "How do you say thank you in French?",
    "What language do they speak in Quebec?",
    "What is the capital of Spain?",
    "What is the best French cheese?",
    "I am going to France next week.",
    "What is the capital of Germany?",
    "What is a croissant?",
    "What is the capital of Belgium?",
    "What is the capital of Mexico?",
    "Where is Barcelona?",
    "What is the capital of Austria?",
    "Tell me about Berlin.",
    "What do people eat in Spain?",
    "What is the capital of Portugal?",
    "Can you recommend a restaurant in Lyon?",
    "Who was Napoleon?",
    "What is the weather like in Rome?",
    "How far is Madrid from Lisbon?",
]
CALLS = [  # two-turn calls: the second turn after the model's own first reply
    ["What is the capital of France?", "No."],
    ["What is the capital of Spain?", "And what about Italy?"],
    ["Tell me about Germany.", "What should I see there?"],
]


def foreign(text: str) -> bool:
    words = re.findall(r"[^\W\d_]+", text.lower())[:12]
    return bool(words) and sum(w in FOREIGN_WORDS for w in words) / len(words) >= 0.3


def conversations() -> list[list[str]]:
    said = [re.sub(r"\s*\|[\d.]+\|\s*", " ", s.text).strip() for s in SCRIPTS]
    return [[t] for t in dict.fromkeys(said)] + [[t] for t in ABROAD] + CALLS


def run(llm: LocalLLM, nudge: str, calls: list[list[str]], verbose: bool) -> tuple[int, int, list[str]]:
    replies = bad = 0
    shown: list[str] = []
    for turns in calls:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "assistant", "content": GREETING}]
        for text in turns:
            messages.append({"role": "user", "content": text + nudge})  # every turn alike: the cache follows
            out: list[str] = []
            llm.stream(messages, max_tokens=50, temperature=0.0, stop=threading.Event(), emit=out.append)
            reply = "".join(out).strip()
            messages.append({"role": "assistant", "content": reply})
            replies += 1
            if foreign(reply):
                bad += 1
                shown.append(f"  {text[:40]!r} -> {reply[:90]!r}")
            elif verbose:
                print(f"     {text[:40]!r} -> {reply[:90]!r}")
    return bad, replies, shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nudge", nargs="+", default=["", " Answer in English."], help="nudges to compare ('' = none)")
    parser.add_argument("--verbose", action="store_true", help="print the English replies too")
    args = parser.parse_args(argv)
    llm = LocalLLM()
    try:
        llm.load(progress=lambda line: print(line, file=sys.stderr))
    except LLMLoadError as exc:
        raise SystemExit(f"llm_language: {exc}") from None
    calls = conversations()
    print(f"{sum(len(c) for c in calls)} replies per nudge ({len(calls)} conversations), greedy")
    rows = []
    for nudge in args.nudge:
        t0 = time.perf_counter()
        bad, n, shown = run(llm, nudge, calls, args.verbose)
        print(f"nudge {nudge.strip() or '(none)'!r}: {bad} of {n} replies foreign ({time.perf_counter() - t0:.0f} s)")
        print("\n".join(shown))
        rows.append((nudge, bad, n))
    print("| nudge | foreign replies |\n|---|---:|")
    for nudge, bad, n in rows:
        print(f"| {nudge.strip() or '(none)'} | {bad} / {n} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
