"""`python -m engine synth ...`: synthesise speech to WAV and print one JSON line of timings;
`python -m engine serve ...`: the HTTP server (engine/serve/)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# The sampling overrides the CLI takes, as SamplingParams fields (--max-new-tokens, --temperature, ...).
SAMPLING_OPTIONS = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty")


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "qwen3-tts-fast"


def tiny_checkpoint(model_type: str) -> Path:
    """A tiny random-weight checkpoint (built once, then reused). Its output is noise, not speech."""
    from .checkpoint.writer import ensure_random_checkpoint

    path = _cache_dir() / f"random-tiny-{model_type}"
    ensure_random_checkpoint(path, "tiny", model_type)
    return path


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default: the value itself, or the words of its help where the default
    depends on the checkpoint (help text that says 'default' already)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or "default" in text.lower():
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return text + " (default: off)"
        return text + " (default: %(default)s)"


def path_option(value: str) -> Path:
    """The type of every path option: a blank value is refused by argparse, naming the option (an empty path
    would mean the current folder)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("the path is empty; give a file or folder name")
    return Path(value)


def _parser() -> argparse.ArgumentParser:
    from .limits import MAX_TAKES
    from .prompt import DEFAULT_NON_STREAMING

    official = ", ".join(f"{mode}: {'on' if on else 'off'}" for mode, on in DEFAULT_NON_STREAMING.items())
    p = argparse.ArgumentParser(prog="python -m engine", description="Qwen3-TTS-12Hz inference engine",
                                formatter_class=_HelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("synth", help="synthesise speech to WAV", formatter_class=_HelpFormatter,
                       description="Synthesise speech to WAV files and print one JSON line of timings.")
    add_load_options(s, model_help="checkpoint directory (default: a tiny RANDOM-weight checkpoint, which speaks "
                                   "noise)")
    s.add_argument("--mode", choices=["custom", "design", "clone"],
                   help="custom (CustomVoice checkpoint), design (VoiceDesign) or clone (Base) (default: the "
                        "checkpoint's own mode)")
    s.add_argument("--text", default="Hello from Qwen3-TTS Fast. This is a test of the engine.",
                   help="the text to speak")
    s.add_argument("--language", default="auto", help="language of the text, or auto to let the model decide")
    s.add_argument("--speaker", default=None, help="CustomVoice speaker (default: the checkpoint's first one)")
    s.add_argument("--instruct", default=None, help="style instruction (custom) or voice description (design) "
                                                    "(default: none; design: 'A calm, clear voice.')")
    s.add_argument("--ref-audio", type=path_option, help="reference WAV for clone mode (default: a synthetic 3 s tone, "
                                                  "useful on random weights only)")
    s.add_argument("--ref-text", default=None, help="transcript of the reference; turns on ICL cloning "
                                                    "(default: none, x-vector cloning)")
    s.add_argument("--xvec-only", action="store_true", help="clone from the speaker embedding only")
    s.add_argument("--takes", type=int, default=1, help=f"takes generated at once, 1 to {MAX_TAKES}")
    s.add_argument("--seed", type=int, default=0, help="random seed: the same seed, text and settings give the "
                                                       "same audio")
    s.add_argument("--first-take", type=int, default=0,
                   help="take i of this run is take (first take + i) of the seed: --takes 1 --first-take 3 "
                        "re-renders take 3 of a --takes 4 run with the same seed")
    s.add_argument("--non-streaming-mode", choices=["on", "off"], default=None,
                   help="on: the whole text is in the prompt; off: it is fed alongside the frames. "
                        f"Default: the official package's default for the mode ({official})")
    s.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    s.add_argument("--max-new-tokens", type=int, default=None,
                   help="most codec frames to generate, 12.5 a second (default: the checkpoint's "
                        "generation_config.json; 64 on random weights)")
    for flag, kind, what in (("--temperature", float, "sampling temperature"), ("--top-k", int, "top-k sampling"),
                             ("--top-p", float, "nucleus sampling"),
                             ("--repetition-penalty", float, "repetition penalty")):
        s.add_argument(flag, type=kind, default=None, help=f"{what} (default: the checkpoint's "
                                                           "generation_config.json)")
    s.add_argument("--voice", type=path_option, help="clone mode: a voice file saved by Voice.save / SaveVoice, instead "
                                              "of --ref-audio (default: none)")
    s.add_argument("--out", type=path_option, default=Path("out.wav"), help="WAV output; with several takes one file "
                                                                     "per take, out_take<i>.wav")
    s.add_argument("--codes-out", type=path_option, help="also write the codes as an int array [takes, frames, 16] to "
                                                  "this .npy file (default: not written)")
    s.add_argument("--stream", action="store_true", help="stream chunks and report time to first audio")
    s.add_argument("--chunk-frames", type=int, default=8, help="frames per streamed chunk, with --stream (12.5 "
                   "frames a second)")

    from .serve.options import add_serve_options

    v = sub.add_parser("serve", help="serve speech over HTTP (an OpenAI-compatible /v1/audio/speech)",
                       formatter_class=_HelpFormatter, description="Load a checkpoint once and serve it over HTTP: "
                       "POST /v1/audio/speech, GET /v1/models, GET /health (docs/SERVER.md).")
    add_load_options(v, required=True, model_help="checkpoint directory")
    add_serve_options(v)
    return p


def add_load_options(p: argparse.ArgumentParser, model_help: str, required: bool = False) -> None:
    """The options that say what to load and how, shared by every command that loads a checkpoint."""
    from .engine_config import SWITCHES

    p.add_argument("--model", type=path_option, required=required, default=argparse.SUPPRESS if required else None,
                   help=model_help)
    p.add_argument("--codec-dir", type=path_option, help="codec to use: a checkpoint folder with speech_tokenizer/, or that "
                   "folder itself (default: the checkpoint's own, else a compatible sibling checkpoint's)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (a GPU when there is one)")
    p.add_argument("--dtype", default="auto", help="bf16, fp16, fp32, or auto (bf16 on a GPU that supports it, "
                                                   "else fp32)")
    p.add_argument("--cuda-graphs", default="auto", choices=SWITCHES,
                   help="capture the decode step as CUDA graphs (GPU only); on: an error where impossible")
    p.add_argument("--triton", default="auto", choices=SWITCHES,
                   help="fused Triton kernels (GPU only); on: an error where unavailable")
    p.add_argument("--batch-invariant", action="store_true",
                   help="each row decodes to the same codes whatever rows run beside it, in bf16 too (a served request "
                        "equals it served alone); needs the Triton kernels, and costs speed at few rows")


def load_options(args) -> dict:
    """Engine.load's keyword arguments from the load options (add_load_options)."""
    return {"device": args.device, "dtype": args.dtype, "cuda_graphs": args.cuda_graphs, "triton": args.triton,
            "codec_dir": args.codec_dir, "batch_invariant": args.batch_invariant}


def check_load_args(args) -> None:
    """The load options' settings and folders, checked by the load's own rules before the default checkpoint is
    written or anything is read; the load itself says what is wrong inside the folders."""
    from . import files
    from .engine_config import EngineConfig
    from .errors import InvalidInputError

    EngineConfig(model_dir="", device=args.device, dtype=args.dtype, cuda_graphs=args.cuda_graphs,
                 triton=args.triton).check_settings(label=lambda field: "--" + field.replace("_", "-"))
    for option, path in (("--model", args.model), ("--codec-dir", args.codec_dir)):
        if path is not None and not files.check_name(path, option).is_dir():
            raise InvalidInputError(f"{option} {path} is not a folder; give the checkpoint directory (the one that "
                                    "holds config.json).")


def note_random_weights(model_dir: Path) -> None:
    """Say on stderr when a checkpoint holds random weights: its audio is noise."""
    from .checkpoint.writer import MANIFEST, is_random_checkpoint

    if is_random_checkpoint(model_dir):
        print(f"note: --model {model_dir} holds RANDOM weights (its {MANIFEST} says so). The audio is "
              "noise, not speech.", file=sys.stderr)


def wav_paths(args) -> list[Path]:
    """The WAV files a run writes: --out, or one file per take."""
    if args.takes == 1:
        return [args.out]
    return [args.out.with_name(f"{args.out.stem}_take{i}{args.out.suffix}") for i in range(args.takes)]


def codes_path(args) -> Path | None:
    """The .npy file --codes-out writes (numpy adds the extension when the name has none)."""
    if args.codes_out is None:
        return None
    return args.codes_out if args.codes_out.suffix == ".npy" else Path(f"{args.codes_out}.npy")


def _model_type(model_dir: Path) -> str | None:
    """tts_model_type of a checkpoint's config.json, or None where unreadable (the load then says why)."""
    path = model_dir / "config.json"
    try:
        if not path.is_file():  # a FIFO or a folder: never opened (a FIFO would block)
            return None
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deeply
        return None
    return cfg.get("tts_model_type") if isinstance(cfg, dict) else None


def check_args(args) -> None:
    """Every option the user typed, checked before anything is loaded or synthesised; errors name the option."""
    from . import checks, files
    from .errors import InvalidInputError, ModeError
    from .limits import MAX_TAKES, SEED_MAX, TAKE_STREAMS
    from .prompt import CHECKPOINT_OF_MODE, MODE_OF_MODEL
    from .sampling import MAX_NEW_TOKENS, SamplingParams

    checks.whole_number("--takes", args.takes, 1, MAX_TAKES)
    checks.whole_number("--seed", args.seed, 0, SEED_MAX)
    last = TAKE_STREAMS - args.takes
    checks.whole_number("--first-take", args.first_take, 0, last,
                        f"Take indices end at {TAKE_STREAMS - 1}, so with --takes {args.takes} the first take is "
                        f"at most {last}." if args.first_take > last else "")
    checks.whole_number("--chunk-frames", args.chunk_frames, 1, MAX_NEW_TOKENS, "8 frames (0.64 s) is typical.")
    # The sampling options the user gave, checked by the engine's own rules over valid defaults, named as options.
    given = {f: getattr(args, f) for f in SAMPLING_OPTIONS if getattr(args, f) is not None}
    params = SamplingParams()
    if "max_new_tokens" in given:
        params = params.capped(given["max_new_tokens"])
    params.replace(**given).validate(label=lambda field: "--" + field.replace("_", "-"))

    check_load_args(args)
    for option, path in (("--ref-audio", args.ref_audio), ("--voice", args.voice)):
        if path is not None:
            files.input_file(path, option)
    # The input files' headers and sizes too (a long, huge or damaged file), before the model is loaded.
    if args.ref_audio is not None:
        from .audio import check_wav

        check_wav(args.ref_audio)
    if args.voice is not None:
        from .voice import Voice

        Voice.load(args.voice)
    if args.model is not None and args.mode is not None:
        model_type = _model_type(args.model)
        native = MODE_OF_MODEL.get(model_type)
        if native is not None and native != args.mode:
            wanted = CHECKPOINT_OF_MODE[args.mode]
            raise ModeError(f"--mode {args.mode} needs a {wanted} checkpoint, but --model {args.model} is a "
                            f"{model_type} checkpoint (mode {native}). Leave --mode out, or give --model a "
                            f"{wanted} checkpoint.")

    for option, value, default in (("--language", args.language, "auto"),
                                   ("--speaker", args.speaker, "the checkpoint's first speaker")):
        if value is not None and not value.strip():
            raise InvalidInputError(f"{option} is empty; leave the option out for its default ({default}).")
    if args.codes_out is not None and files.check_name(args.codes_out, "--codes-out").is_dir():  # before .npy is added
        from .errors import OutputPathError

        raise OutputPathError(f"--codes-out {args.codes_out} is a directory; give a file name, e.g. "
                              f"{args.codes_out / 'codes.npy'}.")
    outputs = [("--out", p) for p in wav_paths(args)]
    if codes_path(args) is not None:
        outputs.append(("--codes-out", codes_path(args)))
    for option, path in outputs:
        files.output_file(path, option)  # a missing folder, a directory, a FIFO, a too-long name: before any work
    if len({os.path.abspath(p) for _, p in outputs}) < len(outputs):
        raise InvalidInputError(f"--codes-out {args.codes_out} would overwrite a WAV file of --out; choose another "
                                "name.")


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


def _write(option: str, path: Path, save, *args) -> None:
    """Run save(*args); a failure the checks could not foresee (a full disk, a folder removed meanwhile) is an
    OutputPathError naming the option, not a traceback."""
    from .errors import OutputPathError

    try:
        save(*args)
    except OSError as exc:
        raise OutputPathError(f"{option}: could not write {path} ({exc.strerror or exc}); free some space or "
                              "choose another path.") from exc


def synth(args) -> dict:
    import numpy as np
    import torch

    from . import audio
    from .engine import Engine
    from .prompt import DEFAULT_NON_STREAMING, MODE_OF_MODEL, Request
    from .voice import Voice

    tiny = args.model is None
    model_type = {m: t for t, m in MODE_OF_MODEL.items()}[args.mode or "custom"]
    model_dir = tiny_checkpoint(model_type) if tiny else args.model
    if tiny:
        print(f"note: no --model given; using a tiny RANDOM-weight {model_type} checkpoint at {model_dir}. "
              "The audio is noise, not speech.", file=sys.stderr)
    else:
        note_random_weights(model_dir)
    t_load = time.perf_counter()
    takes = args.takes  # check_args kept it in 1..MAX_TAKES
    # The takes' graphs are captured in the load (as the loader node does), so the timings' generation is the
    # request alone.
    engine = Engine.load(model_dir, max_takes=takes, warm_takes=takes, **load_options(args))
    load_s = time.perf_counter() - t_load
    random_weights = engine.info.random_weights
    mode = args.mode or MODE_OF_MODEL[engine.model_type]
    params = engine.defaults
    if args.greedy:
        params = params.greedy()
    max_new = args.max_new_tokens if args.max_new_tokens is not None else (64 if random_weights else None)
    if max_new is not None:
        params = params.capped(max_new)
    for name in SAMPLING_OPTIONS[1:]:  # max_new_tokens is applied above
        if getattr(args, name) is not None:
            params = params.replace(**{name: getattr(args, name)})
    voice = None
    if mode == "clone" and args.voice is not None:
        voice = Voice.load(args.voice)
    elif mode == "clone":
        wav, sr = _reference(args)
        ref_text = None if args.xvec_only else (args.ref_text or ("This is the reference." if tiny else None))
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
    for path, row in zip(wav_paths(args), audio_rows):
        _write("--out", path, audio.save_wav, path, row.numpy(), 24000)
        outs.append(str(path))
    if args.codes_out is not None:
        frames = max(c.shape[0] for c in codes)
        arr = np.zeros((len(codes), frames, 16), dtype=np.int64)
        for i, c in enumerate(codes):
            arr[i, : c.shape[0]] = c.numpy()
        _write("--codes-out", codes_path(args), np.save, codes_path(args), arr)
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
    if args.command == "serve":
        from .serve.main import serve

        return serve(args)
    from .errors import Qwen3TTSError

    try:
        check_args(args)  # before any load or synthesis: a wrong option or output path loses no work
        result = synth(args)
    except Qwen3TTSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
