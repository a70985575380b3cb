"""One short run of the bench against live servers: streamvox, and the batch baseline.

Figures on a shared 2-core machine are noisy, so these tests check what must hold whatever the
load (no frame after a cancel ack, paced vs burst delivery, audio covering both text pieces,
stable JSON fields), not the latencies themselves.
"""

from __future__ import annotations

import json

import pytest

from bench import conformance as C
from bench.load import LoadOptions, run_level
from tts_service.cli import main

pytestmark = pytest.mark.timeout(120)

FIGURES = {
    "ttfb_vs_length": {"ttfb_ms_p50", "ttfb_ms_p95", "ttfb_ms_p50_1s", "ttfb_ms_p50_5s", "ttfb_ratio_5s_1s"},
    "delivery_vs_real_time": {"ttlb_ms_p50", "spread_ratio_p50", "max_lead_ms_p50", "underruns"},
    "mid_stream_cancel": {"cancel_ack_ms_p50", "cancel_ack_ms_p95", "frames_after_ack", "audio_after_cancel_ms_p50"},
    "input_update": {"audio_ms_whole", "audio_ms_split_p50", "duration_ratio"},
    "connection_persistence": {"ttfb_ms_p50_first", "ttfb_ms_p50_after_cancel", "ttfb_ms_p50_fresh"},
}
QUICK = C.ConformanceOptions(runs=1, split_runs=1, sweep=False)


async def test_conformance_against_streamvox(live_servers) -> None:
    whisper = C.load_whisper()  # --transcribe: the second piece's words must be heard
    tests = {t["name"]: t for t in await C.run_conformance(live_servers.streaming, QUICK, lambda _: None, whisper)}
    assert set(tests) == set(FIGURES)
    for name, keys in FIGURES.items():
        assert keys <= set(tests[name]), name
        assert isinstance(tests[name]["passed"], bool)
    json.dumps(list(tests.values()))  # the JSON document holds them as they are
    cancel = tests["mid_stream_cancel"]
    assert cancel["acked"] == 1 and cancel["frames_after_ack"] == 0 and cancel["orphan_frames"] == 0
    assert cancel["finished_before_cancel"] == 0 and cancel["passed"]
    assert tests["delivery_vs_real_time"]["spread_ratio_p50"] >= C.MIN_SPREAD  # paced, not a burst
    assert tests["input_update"]["passed"]  # both pieces spoken
    assert tests["input_update"]["second_piece_words_found"] >= C.MIN_WORDS_FOUND
    assert 0.8 <= tests["ttfb_vs_length"]["audio_ms_5s"] / 5000 <= 1.25  # the "~5 s" text is ~5 s


async def test_conformance_against_the_batch_baseline(live_servers) -> None:
    tests = {t["name"]: t for t in await C.run_conformance(live_servers.baseline, QUICK, lambda _: None)}
    delivery = tests["delivery_vs_real_time"]
    assert delivery["spread_ratio_p50"] < 0.1 and not delivery["passed"]  # one burst
    assert delivery["max_lead_ms_p50"] >= 0.9 * delivery["audio_ms"]  # the whole utterance at once
    cancel = tests["mid_stream_cancel"]
    assert cancel["finished_before_cancel"] == 1 and not cancel["passed"]  # nothing left to cancel
    assert cancel["frames_after_ack"] == 0
    assert tests["input_update"]["passed"]


async def test_load_level_against_streamvox(live_servers) -> None:
    opts = LoadOptions(levels=(2,), seconds=3.0, stagger_s=0.5, settle_s=0.0)
    level = await run_level(live_servers.streaming, 2, opts, lambda _: None)
    assert level["streams"] == 2 and level["turns"] >= 2
    assert level["errors"] == 0 and level["timeouts"] == 0
    assert len(level["ttfb_samples_ms"]) == level["turns"]
    assert level["gap_ms_p95"] is not None and level["rtf"] > 0
    assert level["cpu_pct"] is not None  # read from the server's /metrics
    assert level["cpu_s_per_audio_s"] > 0
    assert isinstance(level["capacity_streams"], (int, float)) and level["capacity_streams"] >= 1  # its /readyz


def test_cli_load_with_baseline_writes_json_and_plots(live_servers, tmp_path, capsys) -> None:
    out = tmp_path / "load.json"
    rc = main(
        [
            "bench", "load", "--url", live_servers.streaming, "--baseline", "--baseline-url", live_servers.baseline,
            "--streams", "1", "--seconds", "2", "--json", str(out), "--plot", str(tmp_path / "img"),
        ]
    )  # fmt: skip
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["bench"] == "load" and isinstance(doc["max_healthy_streams"], int)
    level = doc["levels"][0]
    for key in ("streams", "ttfb_ms_p50", "ttfb_ms_p95", "ttfb_ms_p99", "gap_ms_p95", "underrun_ms", "rtf", "cpu_pct"):
        assert key in level
    assert doc["baseline"]["levels"][0]["turns"] >= 1
    assert "PiperVoice.synthesize" in doc["baseline"]["description"]
    assert {p.name for p in (tmp_path / "img").iterdir()} == {"ttfb_cdf.png", "underruns.png"}
    printed = capsys.readouterr().out
    assert "max healthy streams" in printed and "batch baseline" in printed
