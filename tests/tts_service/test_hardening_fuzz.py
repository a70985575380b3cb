"""Issue 13: a stateful property over random message sequences on one WebSocket connection.

Hypothesis drives a real server (in its own thread, so the state machine can be synchronous)
with starts, texts (any Unicode, lone surrogates and NUL included), flushes, ends, cancels,
pings with any JSON id, garbage, binary frames and messages just over the per-message limit,
on a few context ids so that reuse, late tokens and limits are hit. Whatever the sequence:

* the server never closes the connection (every message is below the size cap);
* no reply is ``internal``; every reply is strict JSON (no NaN/Infinity);
* when the connection ends, no stream is left live.

The example count is kept modest: it runs in ``make test`` on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from support.hardening_helpers import strict_json
from support.tts_helpers import NO_ADMISSION_LIMIT
from tts_service.localproc import ServerThread
from tts_service.piper.scheduler import PiperSchedulerOptions
from tts_service.protocol import ErrorCode, Limits, MsgType
from tts_service.server import ServerConfig

LIMITS = Limits(max_text_chars=40, max_context_chars=80, max_contexts=3)
IDS = st.sampled_from(["a", "b", "c", "d"])
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12) | st.sampled_from(
    ["Hi. ", "Okay", "and then ", "\ud800", "a\x00b", "Thanks for calling today. "]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def server_thread(engine):
    options = PiperSchedulerOptions(capacity=NO_ADMISSION_LIMIT)
    with ServerThread(engine, options=options, config=ServerConfig(limits=LIMITS)) as thread:
        yield thread


class OneConnection(RuleBasedStateMachine):
    thread: ServerThread  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self._stack = contextlib.ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(connect(self.thread.url, max_size=None, open_timeout=10))
        ready = strict_json(self.ws.recv(timeout=10))
        assert ready["type"] == MsgType.READY
        self.replies = 0

    # -- what the client sends (json.dumps escapes surrogates, so any str travels)
    def _send(self, obj) -> None:
        self.ws.send(json.dumps(obj) if not isinstance(obj, str | bytes) else obj)

    @rule(cid=IDS, text=st.none() | TEXT, pace=st.booleans(), rate=st.sampled_from([None, 16000, 12345]))
    def start(self, cid: str, text: str | None, pace: bool, rate: int | None) -> None:
        msg = {"type": "start", "context_id": cid, "pace": pace}
        if text is not None:
            msg["text"] = text
        if rate is not None:
            msg["sample_rate"] = rate
        self._send(msg)

    @rule(cid=IDS, text=TEXT)
    def text(self, cid: str, text: str) -> None:
        self._send({"type": "text", "context_id": cid, "text": text})

    @rule(cid=IDS, kind=st.sampled_from(["flush", "end", "cancel"]))
    def control(self, cid: str, kind: str) -> None:
        self._send({"type": kind, "context_id": cid})

    @rule(ping_id=JSON)
    def ping(self, ping_id) -> None:
        self._send({"type": "ping", "id": ping_id})

    @rule(raw=st.sampled_from(['{"type":"ping","id":1e400}', '{"type":"ping","id":NaN}', "9" * 5000, "[" * 3000]))
    def nasty(self, raw: str) -> None:
        self._send(raw)

    @rule(garbage=st.text(max_size=30) | st.binary(max_size=30) | JSON.map(json.dumps))
    def garbage(self, garbage) -> None:
        self._send(garbage if garbage else " ")

    @rule(cid=IDS)
    def too_long(self, cid: str) -> None:
        self._send({"type": "text", "context_id": cid, "text": "x" * (LIMITS.max_text_chars + 1)})

    # -- what it must see
    def _check(self, raw: str | bytes) -> None:
        if isinstance(raw, bytes):
            assert len(raw) >= 8  # an audio frame: header + samples
            return
        msg = strict_json(raw)
        assert isinstance(msg, dict) and "type" in msg, raw[:200]
        assert not (msg["type"] == MsgType.ERROR and msg["code"] == ErrorCode.INTERNAL), msg
        self.replies += 1

    @invariant()
    def connection_stays_open_and_replies_are_valid(self) -> None:
        while True:
            try:
                raw = self.ws.recv(timeout=0.01)
            except TimeoutError:
                return
            except ConnectionClosed as exc:
                raise AssertionError(f"the server closed the connection: {exc}") from None
            self._check(raw)

    def teardown(self) -> None:
        try:
            for cid in ("a", "b", "c", "d"):  # text still buffered for a sentence end is synthesised now
                self._send({"type": "flush", "context_id": cid})
            self._send({"type": "ping", "id": "final"})
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                raw = self.ws.recv(timeout=deadline - time.monotonic())
                self._check(raw)
                if isinstance(raw, str) and strict_json(raw) == {"type": "pong", "id": "final"}:
                    break
            else:
                raise AssertionError("no pong for the final ping")
            settle = time.monotonic() + 0.8  # replies of the synthesis just flushed (errors included)
            with contextlib.suppress(TimeoutError):
                while time.monotonic() < settle:
                    self._check(self.ws.recv(timeout=settle - time.monotonic()))
        finally:
            self._stack.close()
        scheduler = self.thread.server.synth.scheduler
        for _ in range(100):  # the server cancels the connection's contexts as it notices the close
            if scheduler.active == 0:
                break
            time.sleep(0.05)
        assert scheduler.active == 0, f"{scheduler.active} streams left live"


def test_random_message_sequences_on_one_connection(server_thread: ServerThread) -> None:
    OneConnection.thread = server_thread
    run_state_machine_as_test(
        OneConnection,
        settings=settings(
            max_examples=12,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
