"""The offline OpenAI-compatible endpoint, on the real SmolLM2 weights."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from pipelines.local_llm import LLMLoadError, LocalLLM, build_app

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def llm() -> LocalLLM:
    model = LocalLLM()
    model.load(progress=print)  # first run de-quantises the GGUF (~1 min), later runs read the cache
    return model


@pytest.fixture(scope="module")
async def base_url(llm: LocalLLM):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runner = web.AppRunner(build_app(llm))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/v1"
    await runner.cleanup()


QUESTION = [
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]


async def test_streaming_completion_is_openai_shaped(base_url: str) -> None:
    pieces: list[str] = []
    async with aiohttp.ClientSession() as s:
        body = {"model": "x", "messages": QUESTION, "stream": True, "max_tokens": 24}
        async with s.post(f"{base_url}/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            done = False
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line:
                    continue
                assert line.startswith("data: ")
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[6:])
                assert chunk["object"] == "chat.completion.chunk"
                pieces.append(chunk["choices"][0]["delta"].get("content", ""))
    assert done
    text = "".join(pieces)
    assert "Paris" in text, text


async def test_plain_completion_and_models(base_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base_url}/chat/completions", json={"messages": QUESTION, "max_tokens": 16}) as resp:
            data = await resp.json()
        assert data["choices"][0]["message"]["role"] == "assistant"
        assert data["choices"][0]["message"]["content"].strip()
        async with s.get(f"{base_url}/models") as resp:
            assert (await resp.json())["data"][0]["id"]


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        json.dumps({"messages": []}),
        json.dumps({"messages": [{"content": "no role"}]}),
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}),
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}),
        json.dumps({"messages": [{"role": "user", "content": "word " * 9000}]}),  # longer than the context
    ],
)
async def test_bad_requests_get_400_with_reason(base_url: str, body: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base_url}/chat/completions", data=body) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["message"]


async def test_a_client_that_leaves_stops_generation(base_url: str, llm: LocalLLM) -> None:
    long_ask = [{"role": "user", "content": "Write a very long story about the sea."}]
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            f"{base_url}/chat/completions", json={"messages": long_ask, "stream": True, "max_tokens": 2000}
        )
        await resp.content.readline()  # the role chunk: generation has started
        resp.close()
    t0 = time.monotonic()
    # The request must end soon after the client left.
    while llm.busy and time.monotonic() - t0 < 60:
        await asyncio.sleep(0.1)
    assert not llm.busy


async def _cut_after_first_piece(base_url: str, messages) -> str:
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            f"{base_url}/chat/completions", json={"messages": messages, "stream": True, "max_tokens": 500}
        )
        await resp.content.readline()  # the role chunk
        while not (line := (await resp.content.readline()).decode().strip()):
            pass
        resp.close()  # the caller barged in
    return json.loads(line[6:])["choices"][0]["delta"]["content"]


async def _until_idle(llm: LocalLLM) -> None:
    t0 = time.monotonic()
    while llm.busy and time.monotonic() - t0 < 60:
        await asyncio.sleep(0.05)
    assert not llm.busy


async def test_a_cut_stream_ends_quietly(base_url: str, llm: LocalLLM, caplog, capfd) -> None:
    """Issue 10: every barge-in printed aiohttp's 'Cannot write to closing transport' traceback."""
    caplog.set_level(logging.INFO)
    story = [{"role": "user", "content": "Write a very long story about the sea."}]
    for _ in range(3):
        assert await _cut_after_first_piece(base_url, story)
        await _until_idle(llm)
    await asyncio.sleep(0.2)  # let the server finish the handlers
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
    assert "Traceback" not in capfd.readouterr().err
    # The next request in that conversation still works, and reuses the cache of the cut one.
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base_url}/chat/completions", json={"messages": story, "max_tokens": 8}) as resp:
            data = await resp.json()
    assert data["choices"][0]["message"]["content"].strip()
    assert llm.engine.last.reused_tokens == llm.engine.last.prompt_tokens - 1


async def test_a_client_that_gives_up_on_a_plain_request_stops_it(base_url: str, llm: LocalLLM) -> None:
    long_ask = [{"role": "user", "content": "Write a very long story about the sea."}]
    async with aiohttp.ClientSession() as s:
        body = {"messages": long_ask, "max_tokens": 2000}
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(s.post(f"{base_url}/chat/completions", json=body), 0.5)
    await _until_idle(llm)
    # Left after 0.5 s (~40-60 tokens here); the story runs past 400 tokens when nobody stops it.
    assert llm.engine.last.completion_tokens < 200


async def test_usage_and_finish_reason(base_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        body = {"messages": QUESTION, "max_tokens": 3}
        async with s.post(f"{base_url}/chat/completions", json=body) as resp:
            data = await resp.json()
        assert data["choices"][0]["finish_reason"] == "length"
        assert data["usage"]["completion_tokens"] == 3 and data["usage"]["prompt_tokens"] > 10
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}  # what Pipecat sends
        async with s.post(f"{base_url}/chat/completions", json=body) as resp:
            events = [json.loads(line[6:]) async for line in resp.content if line.startswith(b"data: {")]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3


def _words_and_header(llm: LocalLLM, ask: str) -> tuple[int, int]:
    """Tokens of a caller's words, and of the assistant's header after them
    ("<|im_end|>\n<|im_start|>assistant\n"): what a turn must read when all before it is cached."""
    rendered = llm.tokenizer.render([{"role": "user", "content": "\x00"}])
    enc = llm.tokenizer.tokenizer.encode
    header = len(enc(rendered[rendered.index("\x00") + 1 :], add_special_tokens=False).ids)
    return len(enc(ask, add_special_tokens=False).ids), header


async def test_the_agents_start_up_check_leaves_the_greeting_read_for_every_call(base_url: str, llm) -> None:
    """The demo's start-up request to its LLM is a first turn (system prompt, greeting, a caller's
    words): afterwards a call whose caller heard the greeting reads only the caller's words and
    the assistant's header on its first turn, not the system prompt and the greeting."""
    from pipelines.persona import GREETING, SYSTEM_PROMPT
    from pipelines.pipecat_agent import AgentConfig, _llm_refusal

    llm.engine.reset()
    config = AgentConfig(tts_url="ws://127.0.0.1:9/v1/stream", llm_base_url=base_url, llm_model="smollm2")
    assert config.greeting == GREETING and config.system_prompt == SYSTEM_PROMPT
    assert await asyncio.to_thread(_llm_refusal, config) is None
    await _until_idle(llm)
    ask = "What is the capital of France?"
    first_turn = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "assistant", "content": GREETING},
        {"role": "user", "content": ask},
    ]
    body = {"model": "smollm2", "messages": first_turn, "max_tokens": 4}
    async with aiohttp.ClientSession() as s, s.post(f"{base_url}/chat/completions", json=body) as resp:
        usage = (await resp.json())["usage"]
    words, header = _words_and_header(llm, ask)
    assert usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"] == words + header, usage


def test_a_reply_that_ended_has_the_next_turns_opening_read_while_the_caller_listens(llm: LocalLLM) -> None:
    """Once a reply reaches its end token the worker, idle, reads the template's next-turn opening
    into that conversation's slot: the next turn's prefill (between the transcript and the first
    token) is then the caller's words and the assistant's header only. Not after a reply that was
    cut (its conversation does not continue that way)."""
    history = [{"role": "system", "content": "Answer in one short sentence."}]

    def turn(ask: str, max_tokens: int = 60) -> tuple[int, int, str]:
        history.append({"role": "user", "content": ask})
        pieces: list[str] = []
        prompt, _, finish, cached = llm.stream(
            history, max_tokens=max_tokens, temperature=0.0, stop=threading.Event(), emit=pieces.append
        )
        history.append({"role": "assistant", "content": "".join(pieces)})
        return prompt - cached, llm.read_aheads, finish

    def settled(before: int) -> int:
        t0 = time.monotonic()
        while llm.read_aheads == before and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        return llm.read_aheads

    opening = len(llm.tokenizer.turn_opening())
    ask = "What is the capital of France?"
    words, header = _words_and_header(llm, ask)
    _, before, finish = turn("Hello, who are you?")
    assert finish == "stop"
    after = settled(before)
    assert after == before + 1
    read, _, finish = turn(ask)
    # only the words and the assistant's header; without the read-ahead the opening's tokens too
    assert read == words + header, (read, words, header, opening)
    settled(after)
    _, cut_before, finish = turn("Tell me a long story about the sea.", max_tokens=4)
    assert finish == "length"
    time.sleep(0.3)
    assert llm.read_aheads == cut_before  # a reply cut at max_tokens: nothing read ahead


def test_missing_model_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(LLMLoadError, match="does not exist"):
        LocalLLM(tmp_path / "nope.gguf").load(progress=lambda *_: None)


def _long_history() -> list[dict[str, str]]:
    history = [{"role": "system", "content": "Answer in one short sentence."}]
    for i in range(12):
        history.append({"role": "user", "content": f"Question {i}: what is a good name for a red boat on a lake?"})
        history.append({"role": "assistant", "content": f"Answer {i}: call the red boat Lake Ruby, it sounds nice."})
    return history


def _turns(llm: LocalLLM, history: list[dict[str, str]], n: int, max_tokens: int) -> list[tuple[int, int]]:
    """``n`` more turns, the model's own replies kept; (prompt tokens, tokens read) per turn."""
    figures = []
    for i in range(n):
        history.append({"role": "user", "content": f"Turn {i}: and for a blue one?"})
        pieces: list[str] = []
        prompt, _, _, cached = llm.stream(
            history, max_tokens=max_tokens, temperature=0.0, stop=threading.Event(), emit=pieces.append
        )
        assert prompt <= llm.engine.model.max_len - max_tokens
        figures.append((prompt, prompt - cached))
        history.append({"role": "assistant", "content": "".join(pieces) or "Blue Lagoon."})
    return figures


def test_a_history_past_the_cache_moves_it_and_reads_only_new_tokens(caplog) -> None:
    """Issue 22: every few turns of a long call re-read the whole trimmed history (seconds of dead
    air). With the cache following the trim, no turn after the first reads more than its own
    new tokens, the window keeps moving (the oldest messages go), and each move is logged once."""
    caplog.set_level(logging.INFO, logger="pipelines.local_llm")
    small = LocalLLM(slots=1, max_len=384)  # small: trims after a few short turns
    small.load(progress=lambda *_: None)
    history = _long_history()
    figures = _turns(small, history, 10, max_tokens=8)
    moves = [r.getMessage() for r in caplog.records if "outgrew the 384-token context" in r.getMessage()]
    assert len(moves) >= 4, moves  # the first turn (nothing cached yet), then every few turns
    assert all("cached tokens moved" in m for m in moves[1:]), moves
    read = [r for _, r in figures[1:]]
    assert max(read) < 60, figures  # a turn's new tokens (~20 of the question, <= 8 of the reply)
    assert min(p for p, _ in figures) > 250, figures  # ... of a history several times longer


def test_the_reread_policy_reads_the_window_again_where_it_moves() -> None:
    """The exact policy (``--trim reread``): the oldest messages go several at a time, so the
    next turns still read only their new tokens, and the whole window only where it jumped."""
    small = LocalLLM(slots=1, max_len=384, trim="reread")
    small.load(progress=lambda *_: None)
    history = _long_history()
    figures = _turns(small, history, 6, max_tokens=4)
    full = [read > prompt // 2 for prompt, read in figures[1:]]
    assert 1 <= sum(full) <= 3, figures  # the whole window read again only where it jumped
    assert all(read < 60 for (_, read), f in zip(figures[1:], full, strict=True) if not f), figures
    assert history[0]["role"] == "system"


# solo: beside the other make-test worker the slowest health answer read 1,085 ms (alone: 15 ms): with
# both cores busy the prefill thread and the event loop share one; BENCHMARKS, issue 22's LLM section
@pytest.mark.solo
async def test_health_answers_during_a_long_prefill_and_a_huge_request(base_url: str, llm: LocalLLM) -> None:
    """Issue 22: a 136k-token request held /healthz for 0.94 s (tokenised on the event loop)."""
    health = base_url.removesuffix("/v1") + "/healthz"
    long_read = [{"role": "user", "content": "Tell me about the boats on the sea. " * 110}]  # ~1,000 tokens
    huge = [{"role": "user", "content": "word " * 190_000}]  # near the 1 MB body cap: a 400 after tokenising
    waits: list[float] = []
    async with aiohttp.ClientSession() as s:

        async def ask(messages, status: int) -> None:
            body = {"messages": messages, "max_tokens": 1}
            async with s.post(f"{base_url}/chat/completions", json=body) as resp:
                assert resp.status == status

        requests = asyncio.gather(ask(long_read, 200), ask(huge, 400), ask(huge, 400))
        while not requests.done():
            t0 = time.perf_counter()
            async with s.get(health) as resp:
                assert resp.status == 200
            waits.append(time.perf_counter() - t0)
            await asyncio.sleep(0.02)
        await requests
    assert llm.engine.last.prompt_tokens > 900 and llm.engine.last.reused_tokens < 100  # a real long read
    print(f"health: {len(waits)} checks, slowest {max(waits) * 1000:.0f} ms")
    # The aim is 50 ms. The slowest check was 0.81-0.90 s until 12-04 (the tokenizer holds the GIL: a
    # 1 MB message took 0.9 s to tokenise in its worker thread, only to be refused); the local LLM now
    # refuses what cannot fit by its length first, and the slowest was 16-31 ms over three runs.
    # Generous for a loaded CI machine; before the fix this failed every other run at 0.85
    assert len(waits) > 10 and max(waits) < 0.4, (len(waits), max(waits))
    assert float(np.median(waits)) < 0.2, sorted(waits)


def test_the_command_line_says_what_is_wrong(tmp_path, capsys) -> None:
    from pipelines.local_llm import main

    assert main(["--model", str(tmp_path / "nope.gguf")]) == 2
    out = capsys.readouterr()
    assert "does not exist" in out.out and "Traceback" not in out.err
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    assert main(["--model", str(tmp_path / "bad.gguf")]) == 2
    assert "cannot" in capsys.readouterr().out


async def test_four_calls_at_once_all_get_their_first_token_before_any_reply_ends(base_url: str, llm) -> None:
    """Issue 22, part 5: four callers' first turns took 2.0-4.5 s, the LLM serving one request at
    a time (the fourth waited for three whole replies). Interleaved, every first token arrives
    while the other replies are still being written."""
    asks = [f"Write a long story about {t}." for t in ("the sea", "a red boat", "a lost cat", "the moon")]
    async with aiohttp.ClientSession() as s:

        async def call(ask: str) -> tuple[float, float, str]:
            body = {"messages": [QUESTION[0], {"role": "user", "content": ask}], "stream": True, "max_tokens": 40}
            first, text = None, []
            async with s.post(f"{base_url}/chat/completions", json=body) as resp:
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if line.startswith("data: {"):
                        piece = json.loads(line[6:])["choices"][0]["delta"].get("content")
                        if piece:
                            first = first or time.monotonic()
                            text.append(piece)
            return first, time.monotonic(), "".join(text)

        results = await asyncio.gather(*(call(a) for a in asks))
    assert all(text.strip() for _, _, text in results), results
    assert max(first for first, _, _ in results) < min(end for _, end, _ in results), results
    assert not llm.busy
    assert max(llm.decode_batches) >= 2, llm.decode_batches  # their decode steps ran as batches


def test_concurrent_out_of_range_is_a_clear_error(capsys) -> None:
    from pipelines.local_llm import main

    assert main(["--slots", "2", "--concurrent", "3"]) == 2
    assert "concurrent must be within [1, slots=2]" in capsys.readouterr().out


def test_the_models_own_context_comes_from_its_metadata() -> None:
    """``--max-len model``: SmolLM2's GGUF says 8,192 tokens (``llama.context_length``)."""
    from gguf import GGUFReader

    from pipelines.local_llm import bundled_gguf

    field = GGUFReader(str(bundled_gguf())).fields["llama.context_length"]
    whole = LocalLLM(slots=1, max_len="model")
    whole.load(progress=lambda *_: None)
    assert whole.max_len == whole.engine.model.max_len == int(field.contents()) == 8192


async def test_a_full_queue_is_refused_with_503_and_a_reason(base_url: str, llm, monkeypatch) -> None:
    import pipelines.local_llm as local_llm

    monkeypatch.setattr(local_llm, "MAX_WAITING", -llm.concurrent)  # as if every place were taken
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base_url}/chat/completions", json={"messages": QUESTION, "max_tokens": 4}) as resp:
            assert resp.status == 503
            assert "busy" in (await resp.json())["error"]["message"]
    with pytest.raises(local_llm.LLMBusy):
        llm.submit(QUESTION, max_tokens=4, temperature=0.0, stop=threading.Event(), emit=print, done=print)
    assert not llm.busy


def test_a_request_whose_caller_left_while_it_waited_is_not_run(llm) -> None:
    stop = threading.Event()
    stop.set()
    before = llm.engine.last
    assert llm.stream(QUESTION, max_tokens=8, temperature=0.0, stop=stop, emit=print) == (0, 0, "stop", 0)
    assert llm.engine.last is before and not llm.busy


def test_written_replies_give_the_history_back_in_the_models_own_words() -> None:
    """The agent sends back what the caller heard: the TTS's words joined by single spaces, or their
    beginning when a barge-in cut the reply. The server gives the model its reply as it wrote it."""
    from pipelines.local_llm import WrittenReplies

    written = WrittenReplies(keep=2)
    reply = "Sure, here is a list.\n\n- 2 cups of flour\n- 1 teaspoon of salt\n\nMix them well."
    written.add(reply)
    heard = "Sure, here is a list. - 2 cups of flour - 1 teaspoon of salt Mix them well."
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How do I bake bread?"},
        {"role": "assistant", "content": heard},
        {"role": "user", "content": "Thanks."},
    ]
    restored = written.restore(history)
    assert restored[2] == {"role": "assistant", "content": reply}
    assert restored[:2] == history[:2] and restored[3] == history[3] and history[2]["content"] == heard
    # cut by a barge-in after "flour": the reply as written, up to the last letter heard
    cut = written.restore([{"role": "assistant", "content": "Sure, here is a list. - 2 cups of flour"}])
    assert cut[0]["content"] == "Sure, here is a list.\n\n- 2 cups of flour"
    # other words are left as they came (and so are messages already as written)
    other = [{"role": "assistant", "content": "Sure, here is a map."}, {"role": "assistant", "content": reply}]
    assert written.restore(other) is other
    assert written.restored == 2
    # only the last `keep` replies are remembered
    written.add("One.")
    written.add("Two.")
    assert written.restore(history)[2]["content"] == heard


def test_a_reply_heard_without_its_line_breaks_is_still_read_from_the_cache(llm: LocalLLM) -> None:
    """The real model writes a list (line breaks); the next turn's history holds it as the caller
    heard it (single spaces). Only the new turn is read: the reply's tokens come from the cache."""
    ask = "Which one is red?"
    history = [
        {"role": "system", "content": "Answer with a short list."},
        {"role": "user", "content": "List three fruits, one per line, each after a dash."},
    ]
    pieces: list[str] = []
    llm.stream(history, max_tokens=40, temperature=0.0, stop=threading.Event(), emit=pieces.append)
    reply = "".join(pieces)
    assert "\n" in reply, reply  # the premise: what the voice loses is in the reply
    heard = " ".join(reply.split())
    history += [{"role": "assistant", "content": heard}, {"role": "user", "content": ask}]
    restored = llm.written.restored
    prompt, _, _, cached = llm.stream(history, max_tokens=4, temperature=0.0, stop=threading.Event(), emit=len)
    words, header = _words_and_header(llm, ask)
    read = prompt - cached
    assert llm.written.restored == restored + 1
    # the caller's words and the headers (the reply's end token and the user header when the reply
    # was cut at max_tokens and nothing was read ahead); without the restore, the reply from its first
    # line break on as well
    assert read <= words + header + len(llm.tokenizer.turn_opening()), (read, words, header, reply)


def test_a_sampled_reply_is_read_from_the_cache_in_its_own_spelling(llm: LocalLLM) -> None:
    """A sampled reply is often not the tokenizer's own spelling of its text; the next turn, which
    holds that text exactly, still reads only its new tokens (the cached spelling is reused)."""
    ask = "Which one is red?"
    enc = llm.tokenizer.tokenizer
    for seed in range(1, 9):  # sampled replies whose tokens are not the text's plain encoding
        history = [{"role": "user", "content": "List three fruits, one per line, each after a dash."}]
        pieces: list[str] = []
        llm.stream(history, max_tokens=40, temperature=0.7, seed=seed, stop=threading.Event(), emit=pieces.append)
        slot = llm.engine.slots[llm.engine.last.slot]
        reply = "".join(pieces)
        if (
            slot.ids[slot.prompt_len :][: len(enc.encode(reply, add_special_tokens=False).ids)]
            != enc.encode(reply, add_special_tokens=False).ids
        ):
            break
    else:
        pytest.fail("eight sampled replies were all spelled as the tokenizer spells them: no premise")
    history += [{"role": "assistant", "content": reply}, {"role": "user", "content": ask}]
    prompt, _, _, cached = llm.stream(history, max_tokens=4, temperature=0.0, stop=threading.Event(), emit=len)
    words, header = _words_and_header(llm, ask)
    # the caller's words, the headers, and (a reply cut at max_tokens) its last token, which was
    # sampled but never run through the model, and the next turn's opening, never read ahead
    assert prompt - cached <= words + header + len(llm.tokenizer.turn_opening()) + 1, (prompt - cached, reply)


def test_a_long_call_with_sampled_replies_moves_its_window_without_reading_it_again(caplog) -> None:
    """The case that broke the first try at cached spellings (a 20-turn call: the window's move found
    no span to move, 1,707 tokens re-read): sampled replies, spelled as written, and a history that
    outgrows the cache. Every move follows the cache, and no turn after the first reads more than
    its own new tokens."""
    caplog.set_level(logging.INFO, logger="pipelines.local_llm")
    small = LocalLLM(slots=1, max_len=384)
    small.load(progress=lambda *_: None)
    history = _long_history()
    read: list[tuple[int, int]] = []
    for i in range(10):
        history.append({"role": "user", "content": f"Turn {i}: list two names for a blue boat, one per line."})
        pieces: list[str] = []
        prompt, _, _, cached = small.stream(
            history, max_tokens=24, temperature=0.8, seed=i, stop=threading.Event(), emit=pieces.append
        )
        read.append((prompt, prompt - cached))
        history.append({"role": "assistant", "content": " ".join("".join(pieces).split()) or "Blue."})  # as heard
    moves = [r.getMessage() for r in caplog.records if "outgrew the 384-token context" in r.getMessage()]
    assert len(moves) >= 3, moves
    assert all("cached tokens moved" in m for m in moves[1:]), moves
    # a turn's question (~20 tokens), its headers, and a reply cut at max_tokens (its last token)
    assert max(r for _, r in read[1:]) < 36, read  # 22-28 here; spelled afresh, up to 47


def test_the_cached_spelling_is_the_same_text(llm: LocalLLM) -> None:
    """Whatever the cache holds, the spelled prompt decodes to exactly the prompt's text; a span is
    taken from the cache only where it spells what follows the shared beginning."""
    from pipelines.llm_spelling import CachedSpelling

    enc = llm.tokenizer.tokenizer
    cached_text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nOne two three four five six seven."
    odd = enc.encode("\n", add_special_tokens=False).ids * 2  # "\n\n" spelled as two tokens
    tail = " Eight nine ten eleven twelve thirteen fourteen fifteen, sixteen.<|im_end|>\n"
    cache = enc.encode(cached_text, add_special_tokens=False).ids + odd + enc.encode(tail, add_special_tokens=False).ids
    spelling = CachedSpelling(enc, [cache])
    whole = cached_text + "\n\n" + tail + "<|im_start|>user\nAnd then?<|im_end|>\n"
    trimmed = "<|im_start|>system\nBe brief.<|im_end|>\n" + tail + "<|im_start|>user\nAnd then?"
    for text in (whole, trimmed, "Nothing in common at all, not one word.", "", cached_text[:10] + "é" * 3):
        ids = spelling.encode(text)
        assert enc.decode(ids, skip_special_tokens=False) == text
    # the reply's odd spelling is kept, and the trimmed history reuses the cached span after the cut
    assert spelling.encode(whole)[: len(cache)] == cache
    head = enc.encode("<|im_start|>system\nBe brief.<|im_end|>\n", add_special_tokens=False).ids
    span = enc.encode(tail, add_special_tokens=False).ids
    assert spelling.encode(trimmed)[len(head) : len(head) + len(span)] == span


def _sentences(text: str) -> list[str]:
    import re

    return [" ".join(re.findall(r"[a-z']+", s.lower())) for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def test_a_reply_that_starts_saying_a_sentence_again_ends_before_it(llm: LocalLLM, monkeypatch, caplog) -> None:
    """A 20-turn call's replies fell into "So, it's all about learning." said over and over, each
    later reply copying it from the history. With that history the real model loops again; the
    caller hears each sentence once, the reply ends where the repeat began, and the history keeps
    what was said."""
    from pipelines import llm_repeats

    caplog.set_level(logging.INFO, logger="pipelines.local_llm")
    # Which looping history makes the greedy reply loop again depends on the CPU's numerics (the
    # first one does on AVX2 and AVX-512 machines, not on one with AMX): the first that loops is used.
    loops = [
        ("How do I learn?", "So, it's all about learning.", 4, "How do I learn faster?"),
        ("How do I learn?", "So, it's all about learning.", 8, "How do I learn faster?"),
        ("Can you help?", "I can help you with that.", 6, "Can you help me more?"),
        ("How do I plan a trip?", "So, it's all about planning.", 6, "And how do I plan a party?"),
    ]
    history: list[dict[str, str]] = []

    def reply() -> tuple[str, str]:
        llm.engine.reset()  # the same full prefill both times: the same greedy reply up to the guard
        pieces: list[str] = []
        stop = threading.Event()
        _, _, finish, _ = llm.stream(history, max_tokens=64, temperature=0.0, stop=stop, emit=pieces.append)
        return "".join(pieces), finish

    monkeypatch.setattr(llm, "copy_ban", False)  # the copies come from the history: this test is about the guard
    tried = []
    for ask, sentence, times, again in loops:
        history[:] = [
            {"role": "user", "content": ask},
            {"role": "assistant", "content": " ".join([sentence] * times)},
            {"role": "user", "content": again},
        ]
        with monkeypatch.context() as m:  # the premise: without the guard this reply says a sentence again
            m.setattr(llm_repeats.SentenceRepeats, "push", lambda self, piece: piece)
            m.setattr(llm_repeats.SentenceRepeats, "flush", lambda self: "")
            looped, _ = reply()
        said = [s for s in _sentences(looped) if len(s.split()) >= 3]
        if len(said) > len(set(said)):
            break
        tried.append(looped)
    else:
        pytest.fail(f"no looping history made the unguarded reply loop: no premise {tried}")
    guarded, finish = reply()
    said = [s for s in _sentences(guarded) if len(s.split()) >= 3]
    assert said and len(said) == len(set(said)), guarded
    assert looped.startswith(guarded.rstrip()) and len(guarded) < len(looped), (guarded, looped)
    assert finish == "stop"
    assert any("went round in a loop" in r.getMessage() for r in caplog.records)
    assert llm.written.restore([{"role": "assistant", "content": guarded}])[0]["content"] == guarded


def test_a_reply_does_not_copy_the_earlier_replies(llm: LocalLLM, monkeypatch) -> None:
    """A 20-turn call's replies all carried "So step by step, I'm going to show you some tips."
    from the third turn on: the model copied its own history into every answer. With that history
    the real model copies it again unless the copy ban (``llm_chat.CopyBan``) rules it out; with the
    ban the reply holds no run of the earlier replies' words long enough to be a copy, and still
    answers."""
    # Which history the greedy reply copies depends on the CPU's numerics (the looping-history test
    # met that on an AMX Xeon): the first of these that it copies without the ban is used.
    tip = "So step by step, I'm going to show you some tips."
    glad = "Great question, I'm glad you asked. Here is what you need to know."
    candidates = [
        [
            ("How does a train get from one city to another?", f"No worries, I'm glad you like it. {tip}"),
            ("What should I pack for a week of hiking?", f"Well, well, I'm happy to help. {tip}"),
            ("Tell me how to change a flat tyre on my car.", None),
        ],
        [
            ("How does a train get from one city to another?", f"No worries, I'm glad you like it. {tip}"),
            ("What should I pack for a week of hiking?", f"Well, well, I'm happy to help. {tip}"),
            ("How do I plan a birthday party?", f"Absolutely, I'm glad you're enjoying this. {tip}"),
            ("Tell me how to change a flat tyre on my car.", None),
        ],
        [
            ("How do I bake bread?", f"{glad} Mix flour, water and yeast."),
            ("How do I grow tomatoes?", f"{glad} Give them sun and water."),
            ("How do I learn a language?", None),
        ],
    ]
    history: list[dict[str, str]] = []

    def reply() -> str:
        llm.engine.reset()
        pieces: list[str] = []
        llm.stream(history, max_tokens=48, temperature=0.0, stop=threading.Event(), emit=pieces.append)
        return "".join(pieces)

    tried = []
    for turns in candidates:
        history[:] = [
            {"role": role, "content": text}
            for ask, answer in turns
            for role, text in (("user", ask), ("assistant", answer))
            if text is not None
        ]
        earlier = " ".join(_plain_words(m["content"]) for m in history if m["role"] == "assistant")
        with monkeypatch.context() as m:  # the premise: without the ban the greedy reply copies its history
            m.setattr(llm, "copy_ban", False)
            copied = reply()
        if _longest_run(copied, earlier) >= 7:
            break
        tried.append(copied)
    else:
        pytest.fail(f"no history made the reply copy it without the ban: no premise {tried}")
    fresh = reply()
    assert len(_plain_words(fresh).split()) >= 3, fresh
    assert _longest_run(fresh, earlier) < 7, (fresh, copied)
    assert llm.engine.last.copy_blocked > 0


def _plain_words(text: str) -> str:
    from pipelines.llm_repeats import _words  # the words as the sentence guard compares them

    return " ".join(_words(text))


def _longest_run(text: str, earlier: str) -> int:
    """The most words in a row of ``text`` that ``earlier`` also says in a row."""
    words, best = _plain_words(text).split(), 0
    for i in range(len(words)):
        for j in range(i + best + 1, len(words) + 1):
            if f" {' '.join(words[i:j])} " not in f" {earlier} ":
                break
            best = j - i
    return best


@pytest.mark.parametrize(
    ("text", "said", "repeated"),
    [
        (
            "It's all about learning. So, it's all about learning. So, it's all about learning. So, it",
            "It's all about learning. So, it's all about learning.",
            True,
        ),
        ("I can help. I can help you with that. I can help.", "I can help. I can help you with that.", True),
        ("Paris is big. It is old. Paris is lovely.", "Paris is big. It is old. Paris is lovely.", False),
        ("No. No. No.", "No. No. No.", False),  # shorter than three words: may be meant
        ("Mrs. Alice, yes, it's a challenge. It's a challenge.", "Mrs. Alice, yes, it's a challenge.", True),
        ("So you need a plan. You need a plan to go.", "So you need a plan. You need a plan to go.", False),
        ("It costs 3.5 euros. It costs 3.5 euros", "It costs 3.5 euros.", True),  # the last one, at the end
        ("We leave at 3. Then at 3.5 we eat.", "We leave at 3. Then at 3.5 we eat.", False),
    ],
)
def test_a_sentence_is_said_once(text: str, said: str, repeated: bool) -> None:
    """The reply's text in token-like pieces; what comes out, and nothing of a repeat ever leaves."""
    import re

    from pipelines.llm_repeats import SentenceRepeats

    guard = SentenceRepeats()
    out = []
    for piece in re.findall(r"\s*[A-Za-z']+|\s*[^\sA-Za-z']", text):
        out.append(guard.push(piece))
        # held text is a sentence's beginning only: what is out never holds more than one copy
        sentences = [s for s in _sentences("".join(out)) if len(s.split()) >= 3]
        assert len(sentences) == len(set(sentences)), out
    out.append(guard.flush())
    assert "".join(out).strip() == said
    assert guard.repeated == repeated


def test_a_turn_that_reads_much_again_says_where_it_left_the_cache(llm: LocalLLM, caplog) -> None:
    """With DEBUG on (``--verbose``), a request that reads over 64 tokens again names the text where
    its prompt and the cached conversation part: why a turn was slow, without a debugger."""
    caplog.set_level(logging.DEBUG, logger="pipelines.local_llm")
    history = [{"role": "user", "content": "Tell me a long story about a cat."}]
    llm.stream(history, max_tokens=24, temperature=0.0, stop=threading.Event(), emit=len)
    history += [
        {"role": "assistant", "content": "Something else entirely, not what the model wrote. " * 8},
        {"role": "user", "content": "More?"},
    ]
    llm.stream(history, max_tokens=2, temperature=0.0, stop=threading.Event(), emit=len)
    lines = [r.getMessage() for r in caplog.records if "left the cache" in r.getMessage()]
    assert lines and "the prompt 'Something else" in lines[-1] and "assistant" in lines[-1], lines


def test_a_paragraph_break_in_a_token_ends_a_sentence() -> None:
    """Byte-level BPE writes ".\n\n" as one piece and the next word without a space."""
    from pipelines.llm_repeats import SentenceRepeats

    guard = SentenceRepeats()
    pieces = ["Pack", " very", " light", ".\n\n", "Pack", " very", " light", ".\n\n", "Then", " go", "."]
    out = "".join(guard.push(p) for p in pieces) + guard.flush()
    assert out.strip() == "Pack very light." and guard.repeated, out


def test_a_window_whose_cached_spelling_is_just_over_the_room_drops_one_more_step(llm: LocalLLM) -> None:
    """The case an AVX-512 machine's sampled replies found (``abea775``), built on purpose so that
    it does not depend on what a CPU samples: a cached reply spelled in more tokens than the
    tokenizer would, and a room that the plain encoding of the trimmed window fits exactly while
    its cached spelling does not. The prompt keeps the cached spelling and drops one more step;
    the plain encoding would fit but leave the cache at that reply and read the rest again."""
    from pipelines.local_llm import TRIM_STEP

    enc = llm.tokenizer.tokenizer
    odd = "Call it Lake Ruby, a name that sounds nice on the water."
    history = _long_history()[:13]  # the system message and six exchanges
    history[-2]["content"] = odd  # a reply still inside the window after TRIM_STEP drops
    history.append({"role": "user", "content": "And a name for a blue one?"})
    text = llm.tokenizer.render(history)
    at = text.index(odd)
    odd_ids = [t for c in odd for t in enc.encode(c, add_special_tokens=False).ids]  # a token a character
    assert len(odd_ids) > len(enc.encode(odd, add_special_tokens=False).ids) + TRIM_STEP
    cached = (
        enc.encode(text[:at], add_special_tokens=False).ids
        + odd_ids
        + enc.encode(text[at + len(odd) :], add_special_tokens=False).ids
    )
    kept = [m for i, m in enumerate(history) if i == 0 or i > TRIM_STEP]  # the window after one step
    room = len(enc.encode(llm.tokenizer.render(kept), add_special_tokens=False).ids)  # plain: fits exactly
    small = LocalLLM(slots=1, max_len=room + room // 4)  # a cache just this size: room = max_len - max_tokens
    small.load(progress=lambda *_: None)
    small.engine.slots[0].ids = cached
    fitted = small.fit_prompt(history, max_tokens=room // 4)
    # ... and its cached spelling (longer by the odd reply's extra tokens) does not: one more step,
    # and the reply as the cache holds it
    assert fitted.dropped == 2 * TRIM_STEP, fitted.dropped
    assert len(fitted.ids) <= room
    n = len(odd_ids)
    assert any(fitted.ids[i : i + n] == odd_ids for i in range(len(fitted.ids) - n + 1)), "spelled afresh"
