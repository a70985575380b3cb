"""Voice loading: the split cache, and clear refusals for voices that cannot stream."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tts_service.piper.voices import VoiceError, default_voice_path, split_voice


def _write_unsplittable(tmp: Path) -> Path:
    """A valid ONNX model with the right inputs but none of Piper's split tensors."""
    inp = helper.make_tensor_value_info("input", TensorProto.INT64, [1, None])
    lengths = helper.make_tensor_value_info("input_lengths", TensorProto.INT64, [1])
    scales = helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3])
    out = helper.make_tensor_value_info("output", TensorProto.INT64, [1, None])
    graph = helper.make_graph([helper.make_node("Identity", ["input"], ["output"])], "g", [inp, lengths, scales], [out])
    model_path = tmp / "fake.onnx"
    onnx.save(helper.make_model(graph), str(model_path))
    (tmp / "fake.onnx.json").write_text(json.dumps({"audio": {"sample_rate": 22050}, "phoneme_id_map": {}}))
    return model_path


def test_unsplittable_model_is_refused_with_a_reason(tmp_path: Path) -> None:
    model = _write_unsplittable(tmp_path)
    with pytest.raises(VoiceError, match="cannot be split for streaming"):
        split_voice(model, cache=tmp_path / "cache", progress=lambda *_: None)
    assert not list((tmp_path / "cache").rglob("*.onnx")), "no half-written cache entry"


def test_missing_files_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(VoiceError, match="does not exist"):
        split_voice(tmp_path / "nope.onnx", cache=tmp_path)
    lone = tmp_path / "lone.onnx"
    lone.write_bytes(b"x")
    with pytest.raises(VoiceError, match=r"\.onnx\.json"):
        split_voice(lone, cache=tmp_path)


def test_split_is_cached_by_model_hash(tmp_path: Path) -> None:
    src = default_voice_path()
    model = tmp_path / "copy.onnx"
    shutil.copy(src, model)
    shutil.copy(f"{src}.json", f"{model}.json")
    said: list[str] = []
    first = split_voice(model, cache=tmp_path / "cache", progress=said.append)
    assert said and "splitting" in said[0]
    assert first.front_path.is_file() and first.back_path.is_file()
    mtime = first.back_path.stat().st_mtime_ns
    said.clear()
    second = split_voice(model, cache=tmp_path / "cache", progress=said.append)
    assert said == [] and second.back_path == first.back_path
    assert second.back_path.stat().st_mtime_ns == mtime


def test_cli_reports_a_bad_voice_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tts_service", "--voice-path", str(tmp_path / "missing.onnx"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
