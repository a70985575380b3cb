"""The demo's parts under faults (issue 22, part 3): a dead child is reaped and restarted, children
die with a SIGKILLed launcher, configuration that cannot work is one line at start-up, and a call
whose TTS server or LLM dies hears an apology for the lost turn and is answered again once the
part is back.

Real processes throughout: the launcher, its TTS child, SIGKILL, a Twilio caller on the room's
socket; the LLM is the scripted one behind a TCP relay that can cut it off (a dead LLM).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from pipelines.supervisor import Supervisor
from support.pipecat_harness import TwilioCaller, first_time, voiced
from tts_service.localproc import ChildServer, free_port

ROOT = Path(__file__).resolve().parents[2]


def _gone(pid: int) -> bool:
    """No such process, or only a zombie of it (a zombie holds no memory, but is not reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


def _exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _wait(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out ({timeout_s} s) waiting for {what}")


def _web_child(**kw) -> ChildServer:
    port = free_port()
    args = ["-m", "http.server", str(port), "--bind", "127.0.0.1"]
    return ChildServer(args, what="a web server", port=port, ready_path="/", output="quiet", **kw)


def test_a_dead_child_is_reaped_restarted_on_its_port_then_given_up_on():
    said: list[str] = []
    child = _web_child().start(30)
    sup = Supervisor(poll_s=0.05, backoff_s=0.1, max_restarts=2, say=said.append)
    sup.add(child, "web", ready_timeout_s=30)
    sup.start()
    try:
        for restart in (1, 2):
            old = child.proc.pid
            os.kill(old, signal.SIGKILL)
            _wait(lambda: sup.status() == {"web": False}, 5, "the death noticed")
            _wait(lambda: sup.status() == {"web": True}, 30, "the restart")
            assert child.proc.pid != old and not _exists(old), "the dead child was not reaped (a zombie)"
            with urllib.request.urlopen(f"{child.base}/", timeout=5) as resp:  # the same port
                assert resp.status == 200
            assert sum("restarting it in" in line for line in said) == restart
        assert "exited (signal 9)" in said[0] and "is back" in said[1]
        os.kill(child.proc.pid, signal.SIGKILL)
        _wait(lambda: any("not restarting it again" in line for line in said), 5, "giving up")
        time.sleep(0.3)
        assert sup.status() == {"web": False} and not _exists(child.proc.pid)
    finally:
        sup.stop(timeout_s=2)


def test_a_hung_child_is_killed_and_restarted_a_busy_one_is_not():
    """A stopped process (SIGSTOP: its port still accepts, nothing answers) is what a deadlocked
    child looks like to the agent: dead air on every call. The prober notices, the supervisor kills
    and restarts it; a child that answers, however slowly within the bound, is left alone."""
    said: list[str] = []
    child = _web_child().start(30)
    sup = Supervisor(
        poll_s=0.05, backoff_s=0.1, probe_every_s=0.1, probe_timeout_s=0.5, hung_after_s=1.5, say=said.append
    )
    sup.add(child, "web", ready_timeout_s=30, live_path="/")
    sup.start()
    try:
        time.sleep(2.5)  # longer than hung_after_s: a child that answers is not touched
        assert said == [] and sup.status() == {"web": True}
        old = child.proc.pid
        os.kill(old, signal.SIGSTOP)
        _wait(lambda: any("(hung)" in line for line in said), 10, "the hang noticed")
        _wait(lambda: sup.status() == {"web": True} and child.proc.pid != old, 30, "the restart")
        assert not _exists(old), "the hung child was not reaped"
        assert any("killed as hung" in line and "restarting it in" in line for line in said), said
        with urllib.request.urlopen(f"{child.base}/", timeout=5) as resp:  # the same port, answering
            assert resp.status == 200
        time.sleep(2.0)  # the restarted child is probed afresh, not killed again for the old silence
        assert sum("(hung)" in line for line in said) == 1, said
    finally:
        sup.stop(timeout_s=2)


def test_the_hang_bound_outlasts_a_probe():
    with pytest.raises(ValueError, match="longer than probe_timeout_s"):
        Supervisor(probe_timeout_s=5, hung_after_s=3)


PARENT = """
import sys, time
sys.path.insert(0, {root!r})
from tts_service.localproc import ChildServer, free_port
port = free_port()
child = ChildServer(["-m", "http.server", str(port), "--bind", "127.0.0.1"], what="web", port=port,
                    ready_path="/", output="quiet", die_with_parent={die}).start(30)
print(child.proc.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("die", [True, False])
def test_children_die_with_a_sigkilled_parent(die):
    code = PARENT.format(root=str(ROOT), die=die)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        parent.kill()
        parent.wait(5)
        if die:
            _wait(lambda: _gone(pid), 5, "the child to die with its parent")
        else:  # the control: without it, the child outlives a SIGKILLed parent (what issue 22 saw)
            time.sleep(1.0)
            assert _exists(pid) and not _gone(pid)
            os.kill(pid, signal.SIGKILL)
    finally:
        parent.kill()


def test_die_with_parent_needs_a_module():
    with pytest.raises(ValueError, match="-m MODULE"):
        ChildServer(["script.py"], what="x", port=1, die_with_parent=True)


# ---------------------------------------------------------------- the launcher


async def _launcher(env: dict[str, str], port: int) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipelines.pipecat_agent",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )


def _reader(proc, out: list[str]) -> asyncio.Task:
    """Keeps reading the launcher's output (a full pipe would stall it) into ``out``."""

    async def read() -> None:
        while line := await proc.stdout.readline():
            out.append(line.decode(errors="replace"))

    return asyncio.create_task(read())


async def _until_said(out: list[str], reader: asyncio.Task, marker: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(marker in line for line in out):
        if reader.done() or time.monotonic() > deadline:
            raise AssertionError(f"no {marker!r} from the launcher:\n" + "".join(out))
        await asyncio.sleep(0.05)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended while we looked
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TTS_URL", "LLM_", "STREAMVOX_", "AGENT_"))}
    return {**env, "HF_HUB_OFFLINE": "1", **extra}


def _voiced_s(caller: TwilioCaller, since: float) -> float:
    """Seconds of voiced audio the caller received after ``since``."""
    return sum(len(ev["media"]["payload"]) * 3 / 4 / 8000 for t, ev in caller.events if t > since and voiced(ev))


async def ask(caller: TwilioCaller, question: bytes, what: str, timeout: float = 30) -> tuple[float, float]:
    """Say ``question``; (when it ended, when voiced audio came back), once the agent went quiet."""
    put_at = time.monotonic()
    caller.outgoing.put_nowait(question)
    while caller.speech_end < put_at:
        await asyncio.sleep(0.02)
    ended = caller.speech_end
    heard = await first_time(caller.events, lambda t, ev: t > ended and voiced(ev), timeout, what)
    while time.monotonic() - max(t for t, ev in caller.events if voiced(ev)) < 1.5:
        await asyncio.sleep(0.1)
    return ended, heard


class Relay:
    """A TCP relay to the LLM; ``down = True`` cuts its connections and refuses new ones (a dead LLM:
    the client's kept-alive connection must go too)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._down = False
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        self._down = value
        if value:
            for writer in list(self._writers):
                writer.transport.abort()

    async def _pipe(self, reader, writer) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(self, reader, writer) -> None:
        if self._down:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}


@contextlib.asynccontextmanager
async def relay(upstream_port: int):
    """(its port, the :class:`Relay`)."""
    r = Relay(upstream_port)
    server = await asyncio.start_server(r.handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], r
    finally:
        server.close()


QUESTION = "What is the capital of France?"


async def test_the_launcher_restarts_a_killed_tts_child_and_the_call_hears_why_it_lost_a_turn():
    """SIGKILL the TTS child mid-answer: the caller hears an apology, the supervisor reaps and
    restarts the child, the next turn is answered; the LLM drops: an apology again, then an answer.
    Then SIGKILL the launcher: its (restarted) child dies with it."""
    import websockets

    from pipelines.voice_prompts import PHONE, VoicePrompts
    from support.pipecat_harness import REPLIES, fake_llm

    replies = [REPLIES[0], "It is Paris.", "Paris, as I said.", "Paris, once more."]  # the first one is long
    async with (
        fake_llm(replies) as (llm_url, requests),
        relay(int(llm_url.split(":")[2].split("/")[0])) as (
            relay_port,
            llm,
        ),
        aiohttp.ClientSession() as http,
    ):
        port = free_port()
        # the TTS child demands the key; the agent must send it (its fixed messages are rendered with it)
        env = _env(LLM_BASE_URL=f"http://127.0.0.1:{relay_port}/v1", STREAMVOX_API_KEY="s3cret", AGENT_GREETING="")
        proc = await _launcher(env, port)
        out: list[str] = []
        reader = _reader(proc, out)
        tasks: list[asyncio.Task] = []
        try:
            await _until_said(out, reader, "Open http://", 120)
            assert len(requests) == 1  # the start-up check of the LLM
            tts_url = next(w for line in out for w in line.split() if w.startswith("ws://"))
            question = await VoicePrompts(tts_url, api_key="s3cret").clip(QUESTION, PHONE)
            readyz = f"http://127.0.0.1:{port}/readyz"
            async with http.get(readyz) as resp:
                assert resp.status == 200 and (await resp.json())["parts"] == {"tts": True}
            (tts,) = _children(proc.pid)

            async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
                caller = TwilioCaller(ws)
                await caller.hello()
                tasks = [asyncio.create_task(caller.send_audio()), asyncio.create_task(caller.receive())]
                await asyncio.sleep(1.0)
                put_at = time.monotonic()
                caller.outgoing.put_nowait(question)
                await first_time(caller.events, lambda t, ev: t > put_at + 1 and voiced(ev), 30, "the first answer")
                await asyncio.sleep(1.0)  # mid-answer (the reply is ~10 s long) ...
                os.kill(tts, signal.SIGKILL)  # ... the TTS server dies
                killed_at = time.monotonic()
                seen_down = False
                while time.monotonic() - killed_at < 60:
                    async with http.get(readyz) as resp:
                        body = await resp.json()
                    seen_down |= resp.status == 503 and body["parts"] == {"tts": False}
                    if seen_down and resp.status == 200:
                        break
                    await asyncio.sleep(0.1)
                back_at = time.monotonic()
                assert seen_down and resp.status == 200, body
                assert _gone(tts) and not _exists(tts), "the killed TTS child is left a zombie"
                while time.monotonic() - max(t for t, ev in caller.events if voiced(ev)) < 1.0:
                    await asyncio.sleep(0.1)
                tts_apology_s = _voiced_s(caller, killed_at)

                asked = len(requests)
                ended, heard = await ask(caller, question, "the answer once the TTS server is back")
                back_s = heard - max(ended, back_at)
                assert len(requests) > asked

                llm.down = True  # the LLM goes
                asked = len(requests)
                ended, heard = await ask(caller, question, "an apology for the LLM's lost answer")
                llm_apology = (heard - ended, _voiced_s(caller, ended))
                assert len(requests) == asked  # none reached it
                llm.down = False
                ended, heard = await ask(caller, question, "the answer once the LLM is back")
                assert len(requests) > asked and heard - ended < 5.0

            (new_tts,) = _children(proc.pid)
            assert new_tts != tts
            proc.kill()  # SIGKILL: no `finally` runs in the launcher
            await proc.wait()
            await asyncio.to_thread(_wait, lambda: _gone(new_tts), 5, "the TTS child to die with the launcher")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await asyncio.wait_for(reader, 10)
    text = "".join(out)
    assert "the TTS server exited (signal 9); restarting it in 0.5 s" in text and "the TTS server is back" in text
    said = [line[:200] for line in out if any(w in line for w in ("call:", "exited", "Error", "turn "))]
    assert "call: the TTS server failed this turn; the caller hears an apology" in text, "\n".join(said)
    assert "Traceback" not in text
    # the apology clips are ~3-4 s long (2.5-3.2 s of it voiced), the later answers ~1 s: what was heard
    # after each loss was the apology (2.0 s, not 2.5: CI on 2 cores once counted 2.49 s voiced)
    assert tts_apology_s > 2.0 and llm_apology[1] > 2.0, (tts_apology_s, llm_apology)
    assert back_s < 3.0, back_s
    print(
        f"TTS killed mid-answer: {tts_apology_s:.1f} s voiced after (the apology); back: answered {back_s:.2f} s"
        f" after; LLM lost: apology {llm_apology[0]:.2f} s after the question ({llm_apology[1]:.1f} s)"
    )


# The start-up checks are called as the launcher calls them, before its banner (the test above
# sees the banner after them); in-process, to spare a launcher's imports per case.


def _check(config) -> str:
    from pipelines.pipecat_agent import _check_parts
    from pipelines.voice_prompts import VoicePrompts

    with pytest.raises(SystemExit) as failed:
        _check_parts(config, VoicePrompts(config.tts_url, api_key=config.tts_api_key, timeout_s=30))
    text = str(failed.value)
    assert "\n" not in text and "Traceback" not in text
    return text


async def test_a_key_the_tts_server_does_not_take_is_one_line_at_start():
    from pipelines.pipecat_agent import AgentConfig
    from support.pipecat_harness import fake_llm
    from tts_service.localproc import ServerThread
    from tts_service.server import ServerConfig

    with ServerThread(config=ServerConfig(api_key="right")) as tts:
        async with fake_llm() as (llm_url, _requests):
            for key in ("wrong", None):
                config = AgentConfig(tts_url=tts.url, tts_api_key=key, llm_base_url=llm_url)
                text = await asyncio.to_thread(_check, config)
                assert "server refused the API key (HTTP 401)" in text and "set STREAMVOX_API_KEY" in text, text


async def test_a_system_prompt_the_llm_cannot_take_is_one_line_at_start():
    from aiohttp import web

    from pipelines.pipecat_agent import AgentConfig
    from tts_service.localproc import ServerThread

    async def completions(request: web.Request) -> web.Response:  # the local LLM's own 400 for it
        body = await request.json()
        n = len(body["messages"][0]["content"].split())
        message = f"the prompt has {n} tokens; at most 1920 fit this model's cache"
        return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=400)

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", completions)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        with ServerThread() as tts:
            llm_url = f"http://127.0.0.1:{port}/v1"
            config = AgentConfig(tts_url=tts.url, llm_base_url=llm_url, system_prompt="word " * 3000)
            text = await asyncio.to_thread(_check, config)
            config.llm_base_url = f"http://127.0.0.1:{free_port()}/v1"
            unreachable = await asyncio.to_thread(_check, config)
    finally:
        await runner.cleanup()
    assert "HTTP 400: the prompt has 3000 tokens" in text and "shorten AGENT_SYSTEM_PROMPT" in text, text
    assert "cannot reach the LLM" in unreachable
