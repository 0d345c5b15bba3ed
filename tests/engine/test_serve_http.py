"""`python -m engine serve`'s HTTP API over real sockets, on tiny random checkpoints on the CPU: every endpoint,
every response format, streaming against whole responses, a bad value for each field, the API key, voices."""
from __future__ import annotations

import base64
import io
import json
import os
import sys

import numpy as np
import pytest

from engine.config import SAMPLE_RATE
from engine.serve.speech_request import SAMPLING_FIELDS
from tests.support.serve_thread import ServerThread, wav_samples

FRAME = 1920  # samples per codec frame at 24 kHz
KEY = "test-key-0123"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _engine(path):
    from engine import Engine

    return Engine.load(path, device="cpu", dtype="fp32", max_takes=4)


@pytest.fixture(scope="module")
def custom(tiny_checkpoints):
    server = ServerThread(_engine(tiny_checkpoints["custom_voice"]), api_key=KEY)
    yield server
    server.stop()


def _reference_wav() -> bytes:
    from engine.audio import wav_bytes

    t = np.arange(2 * 16000) / 16000
    return wav_bytes((0.3 * np.sin(2 * np.pi * (160 + 40 * t) * t)).astype(np.float32), 16000)


@pytest.fixture(scope="module")
def base(tiny_checkpoints, tmp_path_factory):
    """A Base server whose voices folder holds 'calm', the voice of _reference_wav() with its transcript."""
    from engine.audio import decode_wav

    engine = _engine(tiny_checkpoints["base"])
    voices = tmp_path_factory.mktemp("voices")
    engine.extract_voice(*decode_wav(_reference_wav()), ref_text="A short reference.").save(voices / "calm.safetensors")
    server = ServerThread(engine, voices_dir=voices)
    server.voices = voices
    yield server
    server.stop()


@pytest.fixture(scope="module")
def design(tiny_checkpoints):
    server = ServerThread(_engine(tiny_checkpoints["voice_design"]), max_body=1 << 20)
    yield server
    server.stop()


def _ok(server, **fields) -> tuple[dict, bytes]:
    status, headers, data = server.speech(**fields)
    assert status == 200, data[:500]
    return headers, data


LINE = {"input": "The server speaks.", "voice": "ryan", "max_new_tokens": 6, "seed": 3}


def test_health_models_and_voices(custom):
    status, health = custom.json("GET", "/health", key=None)  # open without the key
    assert status == 200 and health["status"] == "ok" and health["model"] == "custom_voice"
    assert health["memory"] is None  # GPU memory only: torch counts no CPU tensors
    status, models = custom.json("GET", "/v1/models")
    assert status == 200 and models["object"] == "list" and len(models["data"]) == 1
    card = models["data"][0]
    assert card["id"] == "custom_voice" and card["object"] == "model" and card["model_type"] == "custom_voice"
    assert card["speakers"] == custom.engine.speakers and card["max_takes"] == 4 and card["random_weights"] is True
    status, voices = custom.json("GET", "/v1/audio/voices")
    assert status == 200 and voices["speakers"] == custom.engine.speakers and voices["saved_voices"] == []


def test_every_response_format_holds_the_same_audio(custom):
    wav_headers, wav = _ok(custom, **LINE)
    assert wav_headers["content-type"] == "audio/wav"
    samples = wav_samples(wav)
    assert samples.shape == (6 * FRAME,) and np.abs(samples).max() > 0

    pcm_headers, pcm = _ok(custom, **LINE, response_format="pcm")
    assert pcm_headers["content-type"] == "audio/pcm" and pcm_headers["x-sample-rate"] == str(SAMPLE_RATE)
    assert pcm == samples.tobytes()

    soundfile = pytest.importorskip("soundfile")
    flac_headers, flac = _ok(custom, **LINE, response_format="flac")
    assert flac_headers["content-type"] == "audio/flac" and flac[:4] == b"fLaC"
    decoded, rate = soundfile.read(io.BytesIO(flac), dtype="int16")
    assert rate == SAMPLE_RATE and np.array_equal(decoded, samples)  # lossless

    _, body = _ok(custom, **LINE, response_format="json")
    doc = json.loads(body)
    assert doc["sample_rate"] == SAMPLE_RATE and doc["seed"] == 3 and [t["take"] for t in doc["takes"]] == [0]
    assert base64.b64decode(doc["takes"][0]["audio"]) == wav


def test_stream_sends_the_same_pcm_as_a_whole_response(custom):
    headers, streamed = _ok(custom, **LINE, stream=True)
    assert headers["content-type"] == "audio/pcm" and headers.get("transfer-encoding") == "chunked"
    _, whole = _ok(custom, **LINE, response_format="pcm")
    assert len(streamed) == 6 * FRAME * 2 and streamed == whole


@pytest.mark.parametrize("stream", [True, False])
def test_a_response_says_how_long_each_step_of_the_server_took(custom, stream):
    """Server-Timing: the handler's steps before the headers (parse, submit, audio: to the first chunk when streamed,
    to the whole audio otherwise), in ms; together no longer than the client waited for the headers."""
    import time

    from engine.serve.server_timing import parse_header

    t0 = time.perf_counter()
    headers, _ = _ok(custom, **LINE, stream=stream)
    waited_ms = 1000 * (time.perf_counter() - t0)
    steps = parse_header(headers["server-timing"])
    assert list(steps) == ["parse", "submit", "audio"], headers["server-timing"]
    assert all(ms >= 0 for ms in steps.values()) and steps["audio"] > 0
    assert sum(steps.values()) <= waited_ms
    assert parse_header(None) == {} and parse_header("a;desc=x;dur=1.5, b") == {"a": 1.5}


def test_the_audio_is_the_engines_for_that_seed(custom):
    """What the server sends is engine.generate's take for the same request and seed, to 16-bit rounding (the
    server streams, generate decodes whole: the codec's pieces round a little differently)."""
    from engine import Request

    samples = wav_samples(_ok(custom, **LINE, temperature=0.8)[1]).astype(np.float64) / 32768
    params = custom.engine.defaults.capped(6).replace(temperature=0.8)
    ref = custom.engine.generate(Request(mode="custom", text=LINE["input"], speaker="ryan"), seed=3, params=params)
    ref = ref.audio[0, : ref.lengths[0]].double().numpy()
    assert samples.shape == ref.shape and np.abs(samples - ref).max() < 1e-3
    other = wav_samples(_ok(custom, **{**LINE, "seed": 4})[1])
    assert not np.array_equal(other, wav_samples(_ok(custom, **LINE)[1]))


def test_takes_come_as_json_and_first_take_picks_one(custom):
    _, body = _ok(custom, **LINE, takes=2, response_format="json")
    takes = json.loads(body)["takes"]
    assert [t["take"] for t in takes] == [0, 1] and takes[0]["audio"] != takes[1]["audio"]
    assert all(t["duration_s"] == 6 * FRAME / SAMPLE_RATE for t in takes)
    # Take 1 alone is take 1 of the pair: the same codes, so the same audio to the rounding of the codec's batch.
    alone = wav_samples(_ok(custom, **LINE, first_take=1)[1]).astype(int)
    pair = [wav_samples(base64.b64decode(t["audio"])).astype(int) for t in takes]
    assert np.abs(alone - pair[1]).max() <= 2 < np.abs(alone - pair[0]).max()


# (body overrides, the field the error must name, status). Each starts from a valid request on the CustomVoice
# server, so the field named is the only thing wrong. Python's json reads NaN, as many clients write it.
BAD_CUSTOM = [
    ({"model": "tts-1"}, "model", 404), ({"model": 5}, "model", 400),
    ({"input": None}, "input", 400), ({"input": ""}, "input", 400), ({"input": 12}, "input", 400),
    ({"input": "\ud800"}, "input", 400),
    ({"voice": "nobody"}, "voice", 400), ({"voice": None}, "voice", 400), ({"voice": ["ryan"]}, "voice", 400),
    ({"response_format": "mp3"}, "response_format", 400), ({"response_format": 1}, "response_format", 400),
    ({"stream": True, "response_format": "wav"}, "response_format", 400),
    ({"speed": 1.25}, "speed", 400), ({"speed": "fast"}, "speed", 400), ({"speed": float("nan")}, "speed", 400),
    ({"stream": "yes"}, "stream", 400),
    ({"language": "klingon"}, "language", 400), ({"language": 3}, "language", 400),
    ({"instructions": 7}, "instructions", 400),
    ({"seed": -1}, "seed", 400), ({"seed": 1.5}, "seed", 400), ({"seed": 1 << 64}, "seed", 400),
    ({"takes": 0}, "takes", 400), ({"takes": 5, "response_format": "json"}, "takes", 400),
    ({"takes": 2}, "takes", 400), ({"takes": 2, "stream": True}, "takes", 400), ({"takes": True}, "takes", 400),
    ({"first_take": -1}, "first_take", 400), ({"first_take": 1 << 32}, "first_take", 400),
    ({"reference_audio": "UklGRg=="}, "reference_audio", 400), ({"reference_text": "hi"}, "reference_text", 400),
    ({"temprature": 0.7}, "temprature", 400),
    ({"voice_data": "AAAA"}, "voice_data", 400), ({"sample_format": "s24"}, "sample_format", 400),
    ({"sample_format": "f32"}, "sample_format", 400), ({"chunk_frames": 4}, "chunk_frames", 400),
    ({"chunk_frames": 0, "stream": True}, "chunk_frames", 400),
    ({"first_chunk_frames": 3, "chunk_frames": 2, "stream": True}, "first_chunk_frames", 400),
    ({"max_new_tokens": 0}, "max_new_tokens", 400), ({"max_new_tokens": "6"}, "max_new_tokens", 400),
    ({"min_new_tokens": 9}, "min_new_tokens", 400), ({"min_new_tokens": -1}, "min_new_tokens", 400),
    ({"temperature": 0}, "temperature", 400), ({"temperature": "hot"}, "temperature", 400),
    ({"top_k": -1}, "top_k", 400), ({"top_k": 2.5}, "top_k", 400),
    ({"top_p": 0}, "top_p", 400), ({"top_p": 1.5}, "top_p", 400),
    ({"repetition_penalty": 0}, "repetition_penalty", 400),
    ({"do_sample": "no"}, "do_sample", 400), ({"subtalker_dosample": 1}, "subtalker_dosample", 400),
    ({"subtalker_temperature": -1}, "subtalker_temperature", 400), ({"subtalker_top_k": 1.5}, "subtalker_top_k", 400),
    ({"subtalker_top_p": 2}, "subtalker_top_p", 400),
]


def test_the_bad_field_table_covers_every_field():
    from engine.serve.speech_request import FIELDS

    named = {param for _, param, _ in BAD_CUSTOM}
    assert set(FIELDS) <= named and set(SAMPLING_FIELDS) <= named


@pytest.mark.parametrize(("change", "param", "status"), BAD_CUSTOM, ids=lambda v: json.dumps(v)[:40]
                         if isinstance(v, dict) else str(v))
def test_a_bad_field_gets_a_4xx_naming_it(custom, change, param, status):
    got, headers, data = custom.speech(**{**LINE, **change})  # a None is sent as null
    err = json.loads(data)["error"]
    assert got == status and headers["content-type"].startswith("application/json")
    assert err["param"] == param and err["message"] and err["type"] == "invalid_request_error"
    if param is not None:
        assert param in err["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_an_error_the_engine_raises_is_a_400_with_its_message(custom, stream):
    """The engine refuses a prompt longer than its cache before any audio, so a stream gets its JSON error too."""
    status, headers, data = custom.speech(**{**LINE, "input": "many words " * 4000, "stream": stream})
    err = json.loads(data)["error"]
    assert status == 400 and headers["content-type"].startswith("application/json")
    assert err["code"] == "PromptTooLongError" and "Shorten the text" in err["message"]
    assert custom.speech(**LINE)[0] == 200


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"\xff\xfe", b""])
def test_a_body_that_is_not_a_json_object_gets_400(custom, body):
    status, _, data = custom.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
    assert status == 400 and json.loads(data)["error"]["param"] is None


def test_unknown_paths_and_methods_get_json_errors(custom):
    assert custom.json("GET", "/v1/audio/speeches")[0] == 404
    status, body = custom.json("DELETE", "/v1/models")
    assert status == 405 and "/v1/audio/speech" in body["error"]["message"]


def test_flac_without_soundfile_names_the_field_and_the_package(custom, monkeypatch):
    monkeypatch.setitem(sys.modules, "soundfile", None)  # as if not installed: find_spec says so too
    status, body = custom.json("POST", "/v1/audio/speech", {**LINE, "response_format": "flac"})
    assert status == 400 and body["error"]["param"] == "response_format"
    assert "pip install soundfile" in body["error"]["message"]


@pytest.mark.parametrize("header", [None, "Bearer wrong-key", f"Basic {KEY}", f"Bearer {KEY}x", "Bearer "])
def test_a_missing_or_wrong_api_key_gets_401(custom, header):
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/audio/speech", LINE),
                               ("GET", "/v1/audio/voices", None)):
        status, headers, data = custom.request(method, path, body, {"Authorization": header} if header else None,
                                               key=None)
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        assert json.loads(data)["error"]["type"] == "authentication_error"
    assert custom.request("GET", "/v1/models", key=KEY)[0] == 200


def test_a_server_without_a_key_needs_none(design):
    assert design.request("GET", "/v1/models", key=None)[0] == 200


def test_a_body_over_the_limit_gets_413(design):
    status, body = design.json("POST", "/v1/audio/speech", {"input": "x" * (1 << 20)})
    assert status == 413 and body["error"]["param"] is None and "1 MiB" in body["error"]["message"]
    assert design.speech(input="Still serving.", max_new_tokens=2)[0] == 200


def test_design_follows_its_instructions(design):
    line = {"input": "Designed voice.", "max_new_tokens": 5, "voice": "any"}  # voice is ignored by VoiceDesign
    calm = wav_samples(_ok(design, **line, instructions="A calm, low voice.")[1])
    bright = wav_samples(_ok(design, **line, instructions="A bright, fast voice.")[1])
    assert calm.shape == bright.shape == (5 * FRAME,) and not np.array_equal(calm, bright)


def test_clone_from_an_upload_equals_the_saved_voice(base):
    upload = base64.b64encode(_reference_wav()).decode()
    line = {"input": "Cloned line.", "max_new_tokens": 5, "seed": 1}
    uploaded = _ok(base, **line, reference_audio=upload, reference_text="A short reference.")[1]
    as_data_url = _ok(base, **line, reference_audio="data:audio/wav;base64," + upload,
                      reference_text="A short reference.")[1]
    saved = _ok(base, **line, voice="calm")[1]
    assert wav_samples(uploaded).shape == (5 * FRAME,) and uploaded == saved == as_data_url
    x_vector_only = _ok(base, **line, reference_audio=upload)[1]
    assert x_vector_only != uploaded  # without its transcript the voice clones from the embedding alone
    assert base.json("GET", "/v1/audio/voices") == (200, {"model": "base", "speakers": [], "saved_voices": ["calm"],
                                                          "sample_rate": SAMPLE_RATE})


def test_a_saved_voice_is_read_once_while_its_file_is_unchanged(base, monkeypatch):
    from engine.voice import Voice

    reads, load = [], Voice.load.__func__
    monkeypatch.setattr(Voice, "load", classmethod(lambda cls, path: reads.append(path.name) or load(cls, path)))
    path = base.voices / "calm.safetensors"
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a file saved anew is read anew
    line = {"input": "Cloned line.", "max_new_tokens": 3, "seed": 2, "voice": "calm"}
    first, again = _ok(base, **line)[1], _ok(base, **line)[1]
    assert reads == ["calm.safetensors"] and first == again


BAD_BASE = [
    ({}, "voice"), ({"voice": "nobody"}, "voice"), ({"voice": "../calm"}, "voice"), ({"voice": "/etc/passwd"}, "voice"),
    ({"voice": "calm", "reference_audio": "UklGRg=="}, "voice"),
    ({"reference_audio": "%%%"}, "reference_audio"), ({"reference_audio": 5}, "reference_audio"),
    ({"reference_audio": base64.b64encode(b"RIFF0000WAVEjunk").decode()}, "reference_audio"),
    ({"reference_text": "words"}, "reference_text"),
    ({"voice": "calm", "instructions": "whisper"}, "instructions"),
    ({"voice_data": "%%%"}, "voice_data"), ({"voice_data": 5}, "voice_data"),
    ({"voice_data": base64.b64encode(b"not a voice file").decode()}, "voice_data"),
    ({"voice_data": "AAAA", "voice": "calm"}, "voice"),
]


@pytest.mark.parametrize(("change", "param"), BAD_BASE, ids=lambda v: json.dumps(v)[:40] if isinstance(v, dict)
                         else str(v))
def test_a_bad_clone_field_gets_400_naming_it(base, change, param):
    status, body = base.json("POST", "/v1/audio/speech", {"input": "Cloned line.", "max_new_tokens": 3, **change})
    assert status == 400 and body["error"]["param"] == param, body


def test_a_too_short_reference_is_refused_with_the_engines_reason(base):
    from engine.audio import wav_bytes

    short = base64.b64encode(wav_bytes(np.full(8000, 0.2, np.float32), 16000)).decode()
    status, body = base.json("POST", "/v1/audio/speech", {"input": "Hi.", "reference_audio": short})
    assert status == 400 and body["error"]["param"] == "reference_audio" and "shorter than" in body["error"]["message"]
