"""`python -m engine synth ...`: synthesise speech to WAV and print one JSON line of timings."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path



def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "qwen3-tts-fast"


def tiny_checkpoint(model_type: str) -> Path:
    """A tiny random-weight checkpoint (built once, then reused). Its output is noise, not speech."""
    from .checkpoint.writer import ensure_random_checkpoint

    path = _cache_dir() / f"random-tiny-{model_type}"
    ensure_random_checkpoint(path, "tiny", model_type)
    return path


def _parser() -> argparse.ArgumentParser:
    from .prompt import DEFAULT_NON_STREAMING

    official = ", ".join(f"{mode}: {'on' if on else 'off'}" for mode, on in DEFAULT_NON_STREAMING.items())
    p = argparse.ArgumentParser(prog="python -m engine", description="Qwen3-TTS-12Hz inference engine")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("synth", help="synthesise speech to WAV")
    s.add_argument("--model", type=Path, help="checkpoint directory; without it a tiny RANDOM checkpoint is used (noise)")
    s.add_argument("--codec-dir", type=Path, help="codec to use: a checkpoint folder with speech_tokenizer/, or that "
                   "folder itself (default: the checkpoint's own, else a compatible sibling checkpoint's)")
    s.add_argument("--mode", choices=["custom", "design", "clone"], help="default: the checkpoint's own mode")
    s.add_argument("--text", default="Hello from Qwen3-TTS Fast. This is a test of the engine.")
    s.add_argument("--language", default="auto")
    s.add_argument("--speaker", default=None, help="CustomVoice speaker (default: the first one)")
    s.add_argument("--instruct", default=None)
    s.add_argument("--ref-audio", type=Path, help="reference WAV for clone mode")
    s.add_argument("--ref-text", default=None, help="transcript of the reference (turns on ICL cloning)")
    s.add_argument("--xvec-only", action="store_true", help="clone from the speaker embedding only")
    s.add_argument("--takes", type=int, default=1)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--first-take", type=int, default=0,
                   help="take i of this run is take first_take + i of the seed: --takes 1 --first-take 3 "
                        "re-renders take 3 of a --takes 4 run with the same seed")
    s.add_argument("--non-streaming-mode", choices=["on", "off"], default=None,
                   help="on: the whole text is in the prompt; off: it is fed alongside the frames. "
                        f"Default: the official package's default for the mode ({official})")
    s.add_argument("--greedy", action="store_true")
    s.add_argument("--max-new-tokens", type=int, default=None)
    for flag, kind in (("--temperature", float), ("--top-k", int), ("--top-p", float),
                       ("--repetition-penalty", float)):
        s.add_argument(flag, type=kind, default=None, help="default: the checkpoint's generation_config.json")
    s.add_argument("--voice", type=Path, help="clone mode: a voice file saved by Voice.save / SaveVoice "
                                              "(instead of --ref-audio)")
    s.add_argument("--device", default="auto")
    s.add_argument("--dtype", default="auto")
    s.add_argument("--cuda-graphs", default="auto", choices=["auto", "on", "off"])
    s.add_argument("--triton", default="auto", choices=["auto", "on", "off"])
    s.add_argument("--out", type=Path, default=Path("out.wav"), help="one file per take: out.wav or out_take<i>.wav")
    s.add_argument("--codes-out", type=Path, help="write codes as an int array [takes, frames, 16] (.npy)")
    s.add_argument("--stream", action="store_true", help="stream chunks and report time to first audio")
    s.add_argument("--chunk-frames", type=int, default=8, help="frames per streamed chunk (12.5 frames a second)")
    return p


def _reference(args):
    """The reference audio for clone mode: the user's file, or a labelled synthetic one on random weights."""
    import numpy as np

    from . import audio

    if args.ref_audio is not None:
        return audio.load_wav(args.ref_audio)
    t = np.arange(3 * 24000) / 24000.0
    tone = 0.3 * np.sin(2 * np.pi * (150 + 50 * np.sin(2 * np.pi * 0.5 * t)) * t)
    print("note: no --ref-audio given; using a synthetic 3 s tone as the reference", file=sys.stderr)
    return tone.astype(np.float32)[None], 24000


def synth(args) -> dict:
    import numpy as np
    import torch

    from . import audio
    from .engine import Engine
    from .prompt import DEFAULT_NON_STREAMING, MODE_OF_MODEL, Request
    from .voice import Voice

    random_weights = args.model is None
    model_type = {m: t for t, m in MODE_OF_MODEL.items()}[args.mode or "custom"]
    model_dir = tiny_checkpoint(model_type) if random_weights else args.model
    if random_weights:
        print(f"note: no --model given; using a tiny RANDOM-weight {model_type} checkpoint at {model_dir}. "
              "The audio is noise, not speech.", file=sys.stderr)
    t_load = time.perf_counter()
    takes = min(max(args.takes, 1), 16)  # generate() checks args.takes itself
    # The takes' graphs are captured in the load (as the loader node does), so the timings' generation is the
    # request alone.
    engine = Engine.load(model_dir, device=args.device, dtype=args.dtype, cuda_graphs=args.cuda_graphs,
                         triton=args.triton, max_takes=takes, warm_takes=takes, codec_dir=args.codec_dir)
    load_s = time.perf_counter() - t_load
    mode = args.mode or MODE_OF_MODEL[engine.model_type]
    params = engine.defaults
    if args.greedy:
        params = params.greedy()
    max_new = args.max_new_tokens if args.max_new_tokens is not None else (64 if random_weights else None)
    if max_new is not None:
        params = params.replace(max_new_tokens=max_new, min_new_tokens=max(0, min(params.min_new_tokens, max_new)))
    for name in ("temperature", "top_k", "top_p", "repetition_penalty"):
        if getattr(args, name) is not None:
            params = params.replace(**{name: getattr(args, name)})
    voice = None
    if mode == "clone" and args.voice is not None:
        voice = Voice.load(args.voice)
    elif mode == "clone":
        wav, sr = _reference(args)
        ref_text = None if args.xvec_only else (args.ref_text or ("This is the reference." if random_weights else None))
        voice = engine.extract_voice(wav, sr, ref_text=ref_text)
    speaker = args.speaker or (engine.speakers[0] if mode == "custom" and engine.speakers else None)
    instruct = args.instruct if args.instruct is not None else ("A calm, clear voice." if mode == "design" else None)
    non_streaming = None if args.non_streaming_mode is None else args.non_streaming_mode == "on"
    req = Request(mode=mode, text=args.text, language=args.language, speaker=speaker, instruct=instruct, voice=voice,
                  non_streaming_mode=non_streaming)

    t0 = time.perf_counter()
    ttfa = None
    if args.stream:
        audio_parts, code_parts = [[] for _ in range(args.takes)], [[] for _ in range(args.takes)]
        for chunk in engine.stream(req, takes=args.takes, seed=args.seed, first_take=args.first_take, params=params,
                                   chunk_frames=args.chunk_frames):
            if ttfa is None:
                ttfa = chunk.elapsed_s
            audio_parts[chunk.take].append(chunk.audio)
            code_parts[chunk.take].append(chunk.codes)
        audio_rows = [torch.cat(parts) for parts in audio_parts]
        codes = [torch.cat(parts) for parts in code_parts]
    else:
        res = engine.generate(req, takes=args.takes, seed=args.seed, first_take=args.first_take, params=params)
        audio_rows = [res.audio[i, :n] for i, n in enumerate(res.lengths)]
        codes = res.codes
    wall = time.perf_counter() - t0

    outs = []
    for i, row in enumerate(audio_rows):
        path = args.out if args.takes == 1 else args.out.with_name(f"{args.out.stem}_take{i}{args.out.suffix}")
        audio.save_wav(path, row.numpy(), 24000)
        outs.append(str(path))
    if args.codes_out is not None:
        frames = max(c.shape[0] for c in codes)
        arr = np.zeros((len(codes), frames, 16), dtype=np.int64)
        for i, c in enumerate(codes):
            arr[i, : c.shape[0]] = c.numpy()
        np.save(args.codes_out, arr)
    audio_s = sum(r.numel() for r in audio_rows) / 24000.0
    frames_total = max(c.shape[0] for c in codes)
    return {
        "frames": frames_total, "takes": args.takes, "seed": args.seed, "first_take": args.first_take,
        "non_streaming_mode": DEFAULT_NON_STREAMING[mode] if non_streaming is None else non_streaming,
        "audio_s": round(audio_s, 3), "wall_s": round(wall, 3),
        "rtf": round(audio_s / wall, 3) if wall > 0 else None,
        "ms_per_frame": round(1000 * wall / max(frames_total, 1), 2),
        "ttfa_s": round(ttfa, 4) if ttfa is not None else None, "load_s": round(load_s, 2),
        "mode": mode, "engine": engine.info.summary(), "random_weights": random_weights, "outputs": outs,
        "codec_dir": engine.info.codec_dir, "codec_origin": engine.info.codec_origin,
    }


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from .errors import Qwen3TTSError

    try:
        result = synth(args)
    except Qwen3TTSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
