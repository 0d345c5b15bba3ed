"""Checkpoint configs: every field of config.json, generation_config.json and speech_tokenizer/config.json of a
tiny checkpoint in the published layout, mutated (tests/support/config_mutants.py: type swaps, out-of-range
values and ids, nesting, missing keys), must end in a typed project error that names the file and the field,
or in a correct load.

A load's behaviour depends only on the configs it parsed and the weights. So every mutant is parsed the way a
load parses it (loader.read_configs); a mutant whose parsed configs differ from the original's is loaded in
full (weights and all), and a mutant that parses to the original's configs is loaded in full for a sample
(every SAMPLE_EVERY-th), since its load is the original's load. One loaded mutant in GENERATE_EVERY (and the
first of each file) also generates, and its codes must lie in the codec's codebooks.
The CLI (exit 2 and one `error:` line, no traceback) runs a sample of the typed-error mutants.
"""
from __future__ import annotations

import collections
import contextlib
import io

import pytest
import torch

from engine import Engine, Request, cli
from engine.checkpoint.loader import read_configs
from engine.errors import Qwen3TTSError
from tests.support import config_mutants as M

# (checkpoint type, file, only the fields under this path): config.json whole on CustomVoice (its speakers),
# the speaker encoder's section on Base (the only type that reads it), the codec on Base (encoder and decoder).
PLAN = [("custom_voice", "config.json", ()), ("base", "config.json", ("speaker_encoder_config",)),
        ("custom_voice", "generation_config.json", ()), ("base", "speech_tokenizer/config.json", ())]
SAMPLE_EVERY, GENERATE_EVERY, CLI_EVERY = 25, 6, 60


def _signature(configs: dict) -> tuple:
    """What a load builds from its configs (frozen dataclasses compare by value)."""
    codec = configs["codec_config"]
    return configs["config"], configs["sampling"], codec, codec.encoder == {} or configs["encoder_config"]


def _named(mutant: M.Mutant, message: str) -> bool:
    """The message names the mutated file and the field (or, for a mutated object or list, the key that holds
    it; for a file the parser refused as a whole, the file alone)."""
    folder, _, name = mutant.file.rpartition("/")
    if name not in message or (folder and folder not in message):
        return False
    if "nested too deeply" in message or "is not valid JSON" in message:
        return True
    keys = [str(p) for p in mutant.path if isinstance(p, str)]
    return any(f"'{k}'" in message or f"{k}." in message or f".{k}" in message or f"→ {k}" in message
               for k in keys)


def _generate(engine) -> torch.Tensor:
    if engine.model_type == "base":
        tone = 0.3 * torch.sin(torch.arange(24000) / 10.0)
        req = Request(mode="clone", text="Hi.", voice=engine.extract_voice(tone, 24000))
    else:
        req = Request(mode="custom", text="Hi.", speaker=engine.speakers[0])
    return engine.generate(req, params=engine.defaults.capped(2)).codes[0]


def _cli(folder) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["synth", "--model", str(folder), "--out", str(folder.parent / "out.wav"),
                       "--max-new-tokens", "2"])
    return rc, err.getvalue()


@pytest.mark.parametrize("kind,file,under", PLAN, ids=[f"{k}:{f}{'@' + '.'.join(u) if u else ''}"
                                                       for k, f, u in PLAN])
def test_every_field_mutated_gives_a_typed_error_or_a_correct_load(tiny_checkpoints, tmp_path, figure,
                                                                    kind, file, under):
    ws = M.Workspace(tiny_checkpoints[kind], tmp_path)
    doc = ws.original(file)
    original = _signature(read_configs(ws.dir))
    mutants = M.mutants(file, doc, under)
    counts = collections.Counter()
    failures = []
    same = loaded = 0
    for i, mutant in enumerate(mutants):
        ws.write(file, mutant.text(doc))
        try:
            configs = read_configs(ws.dir)
        except Qwen3TTSError as exc:
            counts[f"typed {mutant.group}"] += 1
            if not _named(mutant, str(exc)):
                failures.append(f"{mutant.field} {mutant.kind}: the message names no file or field: {exc}")
            if counts["cli"] * CLI_EVERY <= counts["typed"]:
                counts["cli"] += 1
                rc, err = _cli(ws.dir)
                if rc != 2 or "Traceback" in err or err.count("error:") != 1:
                    failures.append(f"{mutant.field} {mutant.kind}: CLI exit {rc}: {err}")
            counts["typed"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - anything untyped is the failure this test looks for
            failures.append(f"{mutant.field} {mutant.kind}: {type(exc).__name__}: {exc}")
            continue
        unchanged = _signature(configs) == original
        same += unchanged
        if unchanged and same % SAMPLE_EVERY != 1:
            counts[f"loads {mutant.group}"] += 1
            continue
        try:
            engine = Engine.load(ws.dir, device="cpu", dtype="fp32")
        except Qwen3TTSError as exc:  # the weights disagree with an accepted value: named by the reader
            counts[f"typed {mutant.group}"] += 1
            counts["refused by the weights"] += 1
            if "model.safetensors" not in str(exc) and not _named(mutant, str(exc)):
                failures.append(f"{mutant.field} {mutant.kind}: the message names no file or field: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{mutant.field} {mutant.kind}: load: {type(exc).__name__}: {exc}")
            continue
        counts[f"loads {mutant.group}"] += 1
        loaded += 1
        if loaded % GENERATE_EVERY == 1:
            try:
                codes = _generate(engine)
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{mutant.field} {mutant.kind}: loads, but generate: {type(exc).__name__}: {exc}")
                continue
            counts["generated"] += 1
            book = engine.cfg.talker.predictor.vocab_size  # the codec's codebook size (checked at load)
            if codes.numel() and not (0 <= int(codes.min()) and int(codes.max()) < book):
                failures.append(f"{mutant.field} {mutant.kind}: codes outside the codebooks: {codes}")
    ws.restore(file)
    typed = sum(v for k, v in counts.items() if k.startswith("typed "))
    loads = sum(v for k, v in counts.items() if k.startswith("loads "))
    figure(config=f"{kind}:{file}", mutants=len(mutants), typed_errors=typed, loads=loads,
           loaded_in_full=loaded, refused_by_weights=counts["refused by the weights"],
           generated=counts["generated"], cli_runs=counts["cli"],
           by_group={k: v for k, v in sorted(counts.items()) if k.startswith(("typed ", "loads "))})
    assert not failures, f"{len(failures)} of {len(mutants)} mutants failed:\n" + "\n".join(failures[:40])
    assert typed and loads and counts["generated"] and counts["cli"]
