"""StreamvoxTTS's settings and stats: the names and the type every streamvox client shares."""

from __future__ import annotations

import pytest

from agent.livekit import StreamvoxStats, StreamvoxTTS
from tts_service.client import CancelResult
from tts_service.driver import StreamvoxStats as SharedStats

URL = "ws://127.0.0.1:1/v1/stream"


async def test_the_plugin_passes_the_shared_setting_names_to_its_clients() -> None:
    tts = StreamvoxTTS(url=URL, cancel_ack_timeout_s=0.3)
    client = tts._opts.client()
    assert client.settings.cancel_ack_timeout_s == 0.3 and client.settings.connect_attempts == 1
    await client.close()


async def test_the_earlier_cancel_timeout_still_works_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="cancel_timeout=.*cancel_ack_timeout_s"):
        tts = StreamvoxTTS(url=URL, cancel_timeout=0.2)
    assert tts._opts.cancel_ack_timeout_s == 0.2
    with pytest.raises(TypeError, match="open_timeout"):
        StreamvoxTTS(url=URL, open_timeout=1.0)


async def test_one_stats_type_with_the_names_livekit_users_read() -> None:
    assert StreamvoxStats is SharedStats  # the Pipecat service's too
    tts = StreamvoxTTS(url=URL)
    tts._record_cancel("c1", CancelResult(True, 0.01, 4, 2), 0.02)
    tts._record_cancel("c2", CancelResult(False, 1.0, 0, 1, "timeout"), 1.0)
    s = tts.stats
    assert (s.cancels, s.cancels_acked, s.cancel_acks, s.cancels_unacked) == (2, 1, 1, 1)
    assert list(s.cancel_ack_s) == [0.02] and s.frames_dropped == 3 and s.frames_dropped_server == 4
