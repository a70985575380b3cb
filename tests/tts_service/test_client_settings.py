"""TTSClient's settings: the names every streamvox client uses, the earlier ones still accepted."""

from __future__ import annotations

import warnings

import pytest

from tts_service.client import StreamvoxStats, TTSClient

URL = "ws://127.0.0.1:1/v1/stream"


def test_settings_take_the_shared_names_and_reach_the_driver() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        client = TTSClient(URL, cancel_ack_timeout_s=0.3, connect_timeout_s=2.0, reconnect_backoff_s=0.1)
    assert client.settings.cancel_ack_timeout_s == 0.3 and client.driver.settings is client.settings
    assert client.cancel_ack_timeout_s == 0.3
    assert client.replicas.backoff_s == 0.1 and client.replicas.max_backoff_s == 5.0
    assert isinstance(client.stats, StreamvoxStats) and client.stats is client.driver.stats
    assert (client.connections, client.reconnects, client.frames_dropped, client.retries_elsewhere) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("cancel_timeout", "cancel_ack_timeout_s"),
        ("connect_timeout", "connect_timeout_s"),
        ("open_timeout", "open_timeout_s"),
        ("backoff_s", "reconnect_backoff_s"),
        ("max_backoff_s", "reconnect_backoff_max_s"),
    ],
)
def test_the_earlier_names_still_work_with_a_warning(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"{old}=.*{new}"):
        client = TTSClient(URL, **{old: 0.7})
    assert getattr(client.settings, new) == 0.7
    with pytest.warns(DeprecationWarning, match=f"TTSClient.{old} is deprecated"):
        assert getattr(client, old) == 0.7  # the earlier attribute too


def test_an_unknown_setting_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="cancel_timout"):
        TTSClient(URL, cancel_timout=1.0)  # type: ignore[call-arg]
    with pytest.raises(AttributeError, match="reconnect_backoff_min_s"):
        TTSClient(URL).reconnect_backoff_min_s  # noqa: B018 - never a TTSClient name
