"""The bench's own arithmetic: percentiles, ratios and pass rules, health and its selection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import stats
from bench.load import AgentStats, healthy, max_healthy_streams, summarize_level
from bench.servers import http_base, parse_cpu_seconds


@pytest.mark.parametrize("q", [0, 5, 25, 50, 90, 95, 99, 100])
def test_percentile_matches_numpy_linear(q: float) -> None:
    values = [12.0, 3.0, 7.5, 100.0, 42.0, 0.5, 9.0]
    assert stats.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_edge_cases() -> None:
    assert stats.percentile([], 50) is None  # unmeasured is not 0 ms
    assert stats.percentile([7.0], 0) == 7.0
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile([1.0, 3.0], 50) == 2.0  # interpolated, not nearest
    assert stats.percentile([1.0, 3.0], 95) == pytest.approx(2.9)
    assert stats.percentile([5.0, 1.0, None, math.nan, 3.0], 50) == 3.0  # gaps in the data are skipped
    assert stats.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_summary_keys_and_rounding() -> None:
    s = stats.summary([10.02, 20.06], "ttfb_ms")
    assert s == {"ttfb_ms_p50": 15.0, "ttfb_ms_p95": 19.6, "ttfb_ms_n": 2}
    assert stats.summary([], "x") == {"x_p50": None, "x_p95": None, "x_n": 0}


def test_ratio_and_pass_rules() -> None:
    assert stats.ratio(130.0, 100.0) == pytest.approx(1.3)
    assert stats.ratio(None, 100.0) is None
    assert stats.ratio(1.0, 0.0) is None  # no division by zero, no infinite "ratio"
    assert stats.ratio_within(130.0, 100.0, 1.3)  # the limit itself passes
    assert not stats.ratio_within(131.0, 100.0, 1.3)
    assert not stats.ratio_within(None, 100.0, 1.3)  # unknown never passes
    # absolute slack for small figures: 30 ms vs 20 ms is 1.5x but only 10 ms apart
    assert stats.within(30.0, 20.0, 1.3, slack=25.0)
    assert not stats.within(30.0, 20.0, 1.3)
    assert not stats.within(300.0, 200.0, 1.3, slack=25.0)
    assert not stats.within(1.0, 0.0, 1.3, slack=25.0)


def test_cdf_and_gaps() -> None:
    xs, ys = stats.cdf([3.0, 1.0, 2.0, 2.0])
    assert xs == [1.0, 2.0, 2.0, 3.0]
    assert ys == [0.25, 0.5, 0.75, 1.0]
    assert stats.gaps([0.0, 0.05, 0.2]) == pytest.approx([0.05, 0.15])
    assert stats.gaps([1.0]) == []


def _level(streams: int, **kw) -> dict:
    base = {
        "streams": streams,
        "turns": 10,
        "ttfb_ms_p95": 120.0,
        "underruns": 0,
        "refused": 0,
        "errors": 0,
        "timeouts": 0,
    }
    base.update(kw)
    base["healthy"] = healthy(base)
    return base


def test_health_rule() -> None:
    assert _level(1)["healthy"]
    assert _level(1, ttfb_ms_p95=250.0)["healthy"]  # the limit itself is healthy
    assert not _level(1, ttfb_ms_p95=250.1)["healthy"]
    assert not _level(1, underruns=0.25)["healthy"]  # any underrun after the first frame
    assert not _level(1, refused=1)["healthy"]  # a refused stream is not a healthy one
    assert not _level(1, errors=1)["healthy"]
    assert not _level(1, turns=0, ttfb_ms_p95=None)["healthy"]  # nothing measured


def test_max_healthy_streams_is_the_largest_level_with_all_smaller_ones_healthy() -> None:
    levels = [_level(1), _level(2), _level(4), _level(8, ttfb_ms_p95=400.0), _level(16)]
    assert max_healthy_streams(levels) == 4  # 16 looking fine after 8 failed is noise, not capacity
    assert max_healthy_streams(list(reversed(levels))) == 4  # order of the list does not matter
    assert max_healthy_streams([_level(1, underruns=1), _level(2)]) == 0
    assert max_healthy_streams([]) == 0


def test_summarize_level_pools_turns_and_averages_per_stream() -> None:
    a = AgentStats(turns=2, audio_s=6.0, underruns=0, ttfb_s=[0.1, 0.2], gaps_s=[0.04, 0.05])
    b = AgentStats(turns=1, refused=1, audio_s=3.0, underruns=2, underrun_s=0.3, ttfb_s=[0.3], gaps_s=[0.06])
    lv = summarize_level(2, [a, b], wall_s=10.0, cpu_s=5.0)
    assert lv["streams"] == 2 and lv["turns"] == 3 and lv["refused"] == 1
    assert lv["ttfb_ms_p50"] == 200.0
    assert lv["ttfb_ms_p95"] == 290.0
    assert lv["gap_ms_p95"] == 59.0
    assert lv["underruns"] == 1.0  # per stream: (0 + 2) / 2
    assert lv["underrun_ms"] == 150.0  # per stream: (0 + 300) / 2
    assert lv["underrun_ms_max"] == 300.0
    assert lv["streams_with_underruns"] == 1
    assert lv["rtf"] == 0.9  # 9 s of audio in 10 s of wall
    assert lv["cpu_pct"] == 50.0
    assert lv["ttfb_samples_ms"] == [100.0, 200.0, 300.0]
    assert not lv["healthy"]
    assert summarize_level(1, [a], wall_s=10.0, cpu_s=None)["cpu_pct"] is None


def test_cpu_seconds_parsing_and_urls() -> None:
    text = (
        "# HELP process_cpu_seconds_total Total\n# TYPE process_cpu_seconds_total counter\n"
        "process_cpu_seconds_total 12.5\n"
    )
    assert parse_cpu_seconds(text) == 12.5
    assert parse_cpu_seconds("streamvox_ttfb_seconds_count 3.0\n") is None
    assert http_base("ws://127.0.0.1:8765/v1/stream") == "http://127.0.0.1:8765"
    assert http_base("wss://tts.example.com/v1/stream") == "https://tts.example.com"


def test_words_found_in_a_transcript() -> None:
    from bench.conformance import words_found

    wanted = ("thursday", ("three", "3"), "afternoon")
    assert words_found("Sure, I can move your appointment to Thursday at 3 in the afternoon.", wanted) == 1.0
    assert words_found("Sure, I can move your appointment to Thursday.", wanted) == pytest.approx(1 / 3)
    assert words_found("", ("a",)) == 0.0


def test_markdown_of_a_file_it_cannot_render_is_a_one_line_error(tmp_path, capsys) -> None:
    """``bench markdown`` on another JSON (the browser scenario's, a truncated load run): the CLI's
    one-line message with what the file is, not a KeyError traceback."""
    import json

    from tts_service.cli import main

    cases = {
        "scenario.json": ({"summary": {}, "sessions": {}}, 'no "bench" field'),
        "cut.json": ({"bench": "load", "machine": {}, "levels": []}, "missing 'max_healthy_streams'"),
        "other.json": ({"bench": "engine"}, "a 'engine' document"),
    }
    for name, (doc, why) in cases.items():
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        assert main(["bench", "markdown", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and why in err and name in err, err
