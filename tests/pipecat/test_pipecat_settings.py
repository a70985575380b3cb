"""StreamvoxTTSService's settings: the shared names, the earlier one accepted with a warning."""

from __future__ import annotations

import warnings

import pytest

from agent.pipecat import StreamvoxStats, StreamvoxTTSService
from tts_service.driver import StreamvoxStats as DriverStats

URL = "ws://127.0.0.1:1/v1/stream"


def test_the_service_takes_the_shared_setting_names() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        tts = StreamvoxTTSService(
            url=URL, cancel_ack_timeout_s=0.4, reconnect_backoff_s=0.1, reconnect_backoff_max_s=1.0
        )
    s = tts._driver.settings
    assert (s.cancel_ack_timeout_s, s.reconnect_backoff_s, s.reconnect_backoff_max_s) == (0.4, 0.1, 1.0)
    assert tts._reconnect_backoff_min_wait == 0.1 and tts._reconnect_backoff_max_wait == 1.0  # WebsocketService's
    assert StreamvoxStats is DriverStats and isinstance(tts.stats, StreamvoxStats)


def test_the_earlier_backoff_name_still_works_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="reconnect_backoff_min_s=.*reconnect_backoff_s"):
        tts = StreamvoxTTSService(url=URL, reconnect_backoff_min_s=0.05)
    assert tts._driver.settings.reconnect_backoff_s == 0.05 and tts._replicas.backoff_s == 0.05
