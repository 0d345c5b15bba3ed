"""Bad input on the device path: every engine-API case of tests/support/bad_inputs.py against CUDA
engines with graphs on (bf16, Triton kernels where available).

A bad value must be refused before anything reaches the device: a reference code outside the codebook or a
NaN that got into a captured graph would poison the CUDA context (device-side assert) or the graph's static
buffers. So after all cases the device must still synchronise cleanly, the fixed-seed output must equal the
run made before them, and streaming at odd chunk sizes (codec graphs captured on first use) must equal the
whole-take run. Prints its figures (pytest -s)."""
from __future__ import annotations

import json

import pytest
import torch

from engine import Engine, Request, Voice
from engine.errors import Qwen3TTSError, VoiceError
from tests.support import bad_inputs as B
from tests.robustness.test_bad_input_classes import REQUEST, run_engine

pytestmark = pytest.mark.gpu
RAN: dict[str, str] = {}


def _load(path):
    return Engine.load(path, device="cuda", dtype="bf16", cuda_graphs="on", triton="auto", max_takes=4,
                       max_seq_len=512)


def _reference_run(engine):
    return engine.generate(Request(mode="custom", **REQUEST["custom"]), seed=11,
                           params=engine.defaults.replace(max_new_tokens=6)).codes[0]


@pytest.fixture(scope="module")
def ctx(tiny_checkpoints, tmp_path_factory):
    engines = {mt: _load(p) for mt, p in tiny_checkpoints.items()}
    assert all(e.info.cuda_graphs for e in engines.values()), [e.info.notes for e in engines.values()]
    tmp = tmp_path_factory.mktemp("bad_inputs_gpu")
    voice = engines["base"].extract_voice(B.tone(), B.SR)
    return {"engines": engines, "ckpts": tiny_checkpoints, "tmp": tmp, "voice": voice,
            "good_voice": voice.save(tmp / "good.safetensors"), "good_embedding": voice.spk_embedding,
            "before": _reference_run(engines["custom_voice"])}


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{c.cls}|{c.variant}") for c in B.CASES
                                  if "engine" in c.surfaces])
def test_engine_case_on_the_device(ctx, case):
    if case.expect == "ok":
        out = run_engine(case, ctx)
        audio = getattr(out, "audio", None)
        if audio is not None:
            assert bool(torch.isfinite(audio).all())
        RAN[case.id] = "ok"
    else:
        with pytest.raises(Qwen3TTSError):
            run_engine(case, ctx)
        RAN[case.id] = "typed error"
    torch.cuda.synchronize()  # a device-side assert would surface here, and poison every later case


def test_codes_outside_the_codebook_never_reach_the_device(ctx):
    e = ctx["engines"]["base"]
    bad = Voice(spk_embedding=ctx["voice"].spk_embedding, model_size=ctx["voice"].model_size,
                ref_codes=torch.full((4, 16), 5000, dtype=torch.long), ref_text="Reference.")
    with pytest.raises(VoiceError, match="outside the codebook"):
        e.generate(Request(mode="clone", text="Hi.", voice=bad), params=e.defaults.replace(max_new_tokens=2))
    torch.cuda.synchronize()


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_odd_chunk_sizes_stream_what_generate_makes(ctx, chunk):
    e = ctx["engines"]["custom_voice"]
    req, params = Request(mode="custom", **REQUEST["custom"]), e.defaults.replace(max_new_tokens=9)
    whole = e.generate(req, seed=5, params=params)
    chunks = list(e.stream(req, seed=5, params=params, chunk_frames=chunk))
    streamed = torch.cat([c.audio for c in chunks])
    codes = torch.cat([c.codes for c in chunks])
    assert torch.equal(codes, whole.codes[0]) and streamed.shape[0] == whole.lengths[0]
    assert (streamed - whole.audio[0, : whole.lengths[0]]).abs().max().item() <= 0.05  # bf16 stream vs one pass


def test_graphs_unharmed_after_every_case(ctx):
    torch.cuda.synchronize()
    after = _reference_run(ctx["engines"]["custom_voice"])
    assert torch.equal(after, ctx["before"])
    errors = sum(v == "typed error" for v in RAN.values())
    print(json.dumps({"cases": len(RAN), "typed_errors": errors, "accepted": len(RAN) - errors,
                      "classes": len({k.split("[")[0] for k in RAN}), "fixed_seed_unchanged": True,
                      "device": torch.cuda.get_device_name()}))
    assert len(RAN) == sum("engine" in c.surfaces for c in B.CASES)
