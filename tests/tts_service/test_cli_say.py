"""``streamvox say`` answers a refused request or an empty text with one line, not a traceback."""

from __future__ import annotations

import wave

import pytest

from tts_service.cli import main
from tts_service.localproc import ServerThread
from tts_service.piper.scheduler import PiperSchedulerOptions


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(engine, options=PiperSchedulerOptions(capacity=1000.0)) as server:
        yield server.url


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--voice", "nope", "Hello."], "unknown voice 'nope'"),
        (["--sample-rate", "12345", "Hello."], "sample_rate 12345 not supported"),
        (["   "], "nothing to say"),
    ],
)
def test_a_refused_request_is_one_line(url, tmp_path, capsys, args, says):
    assert main(["say", "--url", url, "-o", str(tmp_path / "x.wav"), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_say_writes_the_speech(url, tmp_path, capsys):
    out = tmp_path / "hello.wav"
    assert main(["say", "--url", url, "-o", str(out), "--no-pace", "Hello there."]) == 0
    with wave.open(str(out)) as w:
        assert w.getnframes() / w.getframerate() > 0.3
    assert "TTFB" in capsys.readouterr().out
