"""The reference clip of the serving benches (Base ICL clones), and the saved voice made from it once.

The clip is example_workflows/qwen3tts_reference.ogg (5.1 s, read with soundfile) with its transcript; without
soundfile a 5 s synthesized tone sweep of the same length stands in (a random checkpoint clones either alike).
"""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIP = ROOT / "example_workflows" / "qwen3tts_reference.ogg"
CLIP_TEXT = "The quick brown fox jumps over the lazy dog. Then it runs away."
VOICE_NAME = "bench_reference"


def reference() -> tuple:
    """(mono float32 samples, sample rate) of the reference clip."""
    import numpy as np

    try:
        import soundfile

        samples, rate = soundfile.read(str(CLIP), dtype="float32", always_2d=True)
        return samples.mean(axis=1), rate
    except (ImportError, RuntimeError):
        rate = 24000
        t = np.arange(5 * rate) / rate
        return (0.3 * np.sin(2 * np.pi * (120 + 60 * t) * t)).astype(np.float32), rate


def reference_wav_base64() -> str:
    """The clip as a WAV file in base64: a request's `reference_audio`."""
    sys.path.insert(0, str(ROOT))
    from engine.audio import wav_bytes

    samples, rate = reference()
    return base64.b64encode(wav_bytes(samples, rate)).decode()


def is_base(model: Path) -> bool:
    """Whether the checkpoint folder `model` is a Base checkpoint (its requests clone a voice)."""
    return json.loads((model / "config.json").read_text()).get("tts_model_type") == "base"


def saved_voice(model: Path, load_options: dict) -> Path:
    """VOICE_NAME.safetensors in the folder `<model>-voices` beside the checkpoint, extracted from the clip with its
    transcript by Engine.extract_voice in a fresh process (the bench's server loads after it ends), unless it is
    there already."""
    from timing import run_fresh

    voices_dir = model.parent / f"{model.name}-voices"
    path = voices_dir / f"{VOICE_NAME}.safetensors"
    if not path.is_file():
        voices_dir.mkdir(parents=True, exist_ok=True)
        r = run_fresh(Path(__file__), [str(model), str(path), json.dumps(load_options)])
        if "error" in r:
            raise SystemExit(f"extracting the bench voice failed: {r['error']}")
    return path


def _extract(model: str, out: str, options: str) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from engine import Engine

    samples, rate = reference()
    eng = Engine.load(model, **json.loads(options))
    voice = eng.extract_voice(torch.from_numpy(samples), rate, CLIP_TEXT)
    voice.save(out)
    return {"voice": out}


if __name__ == "__main__":  # the fresh process of saved_voice
    print(json.dumps(_extract(*sys.argv[1:4])))
