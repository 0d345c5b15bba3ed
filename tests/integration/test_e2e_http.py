"""End to end over HTTP: a real ComfyUI 0.3.75 subprocess on 127.0.0.1 with the pack and tiny checkpoints."""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import time

import numpy as np
import pytest

from tests.support._q3support import (
    EXAMPLE_WORKFLOWS,
    PACK,
    load_script,
    read_audio,
    running_comfy,
)

pytestmark = [pytest.mark.engine]
client = load_script("comfy_client")
ui_to_api = load_script("ui_to_api")
FRAMES = client.TEST_MAX_NEW_TOKENS
SPF = 1920
EVENT = "qwen3tts_fast.stream"


@pytest.fixture(scope="module")
def server(comfy_base):
    with running_comfy(comfy_base, object_info=True) as c:
        yield c


def load_wf(name):
    return json.loads((PACK / "example_workflows" / f"{name}.json").read_text())


def run(c, prompt, workflow=None):
    status, body = c.queue(prompt, workflow)
    assert status == 200, body
    return c.wait(body["prompt_id"])


def outputs_by_prefix(entry, base):
    files = {}
    for f in client.output_files(entry, base):
        files.setdefault(f.name.rsplit("_", 2)[0], []).append(f)
    return files


EXPECTED = {  # workflow -> {file prefix: number of files}
    "qwen3tts_custom_voice_takes": {"custom_voice_picked": 1, "custom_voice_all_takes": 4},
    "qwen3tts_voice_design": {"voice_design": 1},
    "qwen3tts_voice_clone_xvector": {"clone_xvector": 1},
    "qwen3tts_voice_clone_icl": {"clone_icl": 1},
    "qwen3tts_save_and_load_voice": {"saved_voice": 1},
    "qwen3tts_streaming": {"streaming": 1},
    "qwen3tts_script_dialogue": {"dialogue": 1},
}
SRT_TIME = re.compile(r"(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})")


def srt_cues(text):
    """[(start ms, end ms, text)] of SRT text."""
    cues = []
    for block in text.strip().split("\n\n"):
        _, times, *body = block.split("\n")
        g = [int(x) for x in SRT_TIME.fullmatch(times).groups()]
        start, end = (((h * 60 + m) * 60 + s) * 1000 + ms for h, m, s, ms in (g[:4], g[4:]))
        cues.append((start, end, "\n".join(body)))
    return cues


def check_dialogue(entry, base, track_path):
    """The SRT file matches the track: 5 lines of 12 frames, the gaps and pauses of the script between them."""
    srt_out = next(o["subtitles"][0] for o in entry["outputs"].values() if "subtitles" in o)
    cues = srt_cues((base / "output" / srt_out["subfolder"] / srt_out["filename"]).read_text(encoding="utf-8"))
    assert [c[2].split(":")[0] for c in cues] == ["Ava", "Ben", "Cleo", "Ava", "Cleo"]
    assert all(end - start == FRAMES * SPF // 24 for start, end, _ in cues)  # ms
    assert [b[0] - a[1] for a, b in itertools.pairwise(cues)] == [300, 800, 300, 500]  # line_gap 0.3 s, pause tags
    x, _ = read_audio(track_path)
    assert cues[0][0] == 0 and x.size == cues[-1][1] * 24
    for start, end, _ in cues:
        assert np.abs(x[start * 24:end * 24]).max() > 0
        assert end == cues[-1][1] or np.all(x[end * 24:end * 24 + 300 * 24] == 0)  # silence after each line


@pytest.mark.parametrize("name", EXAMPLE_WORKFLOWS)
def test_example_workflow_runs(server, name):
    wf = load_wf(name)
    entry = run(server, ui_to_api.convert(wf, server.object_info), wf)
    assert entry["status"]["status_str"] == "success", entry["status"]
    files = outputs_by_prefix(entry, server.base)
    assert {k: len(v) for k, v in files.items()} == EXPECTED[name]
    for paths in files.values():
        for p in paths:
            x, sr = read_audio(p)
            assert sr == 24000
            if name != "qwen3tts_script_dialogue":
                assert x.size == FRAMES * SPF, (p, x.size)  # tiny checkpoints never stop early: 12 frames
            assert np.isfinite(x).all() and np.abs(x).max() > 0
    if name == "qwen3tts_script_dialogue":
        check_dialogue(entry, server.base, files["dialogue"][0])
    if name == "qwen3tts_custom_voice_takes":
        pick = next(o for o in entry["outputs"].values() if "qwen3tts_takes" in o)
        assert len(pick["qwen3tts_takes"]) == 4
        assert all(t["samples"] == FRAMES * SPF for t in pick["qwen3tts_takes"])
    if name == "qwen3tts_save_and_load_voice":
        assert (server.base / "models" / "qwen3_tts" / "voices" / "qwen3tts_example_voice.safetensors").is_file()


async def _run_with_ws(c, prompt, on_message=None, timeout=300):
    import aiohttp

    events = []
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(f"ws://127.0.0.1:{c.port}/ws?clientId={c.client_id}") as ws:
            async with s.post(f"{c.url}/prompt", json={"prompt": prompt, "client_id": c.client_id}) as r:
                body = await r.json()
                assert r.status == 200, body
            pid = body["prompt_id"]
            t_end = time.time() + timeout
            while time.time() < t_end:
                msg = await ws.receive(timeout=timeout)
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                m = json.loads(msg.data)
                events.append(m)
                if on_message:
                    await on_message(m, s)
                if m["type"] in ("execution_success", "execution_error", "execution_interrupted") and \
                        m["data"].get("prompt_id") == pid:
                    break
    return pid, events


def test_stream_events_in_order_and_equal_to_final_audio(server):
    wf = load_wf("qwen3tts_streaming")
    prompt = ui_to_api.convert(wf, server.object_info)
    prompt["2"]["inputs"]["seed"] = 1234  # a fresh seed: no cached result
    pid, events = asyncio.run(_run_with_ws(server, prompt))
    stream = [e["data"] for e in events if e["type"] == EVENT]
    assert stream[0]["phase"] == "start" and stream[-1]["phase"] == "end"
    chunks = [d for d in stream if d["phase"] == "chunk"]
    assert [d["seq"] for d in chunks] == list(range(len(chunks)))
    assert len(chunks) >= FRAMES // 4  # chunk_frames 4
    assert chunks[0]["samples"] <= 2 * SPF  # the first chunk is 2 frames at most, for the earliest first audio
    assert all(d["node"] == "2" and d["sample_rate"] == 24000 for d in stream if d["phase"] == "start")
    pcm = np.concatenate([np.frombuffer(base64.b64decode(d["pcm"]), "<f4") for d in chunks])
    assert pcm.size == stream[-1]["samples"] == FRAMES * SPF
    entry = server.wait(pid)
    (path,) = client.output_files(entry, server.base)
    final, sr = read_audio(path)
    assert sr == 24000 and final.size == pcm.size
    assert np.max(np.abs(final - np.clip(pcm, -1, 1))) < 1e-4  # FLAC stores 16/24-bit PCM
    progress = [e["data"] for e in events if e["type"] == "progress" and e["data"].get("node") == "2"]
    assert progress and progress[-1]["value"] == progress[-1]["max"] == FRAMES  # progress in frames


def test_stream_long_text_rows_in_order_equal_the_generator_node(server):
    """StreamChunks on long text: the segments stream as rows of one stream (more rows than the loader's
    4 slots); the chunks arrive in order, the first one 2 frames from segment 1, and the streamed audio and the
    AUDIO equal the CustomVoice node's on the same text, seed, speaker and first_take (16-bit files: a step
    or two)."""
    from tests.support._q3support import load_pure

    au, ts = load_pure("audio_utils"), load_pure("text_split")
    text = ("Sentence one is here. Sentence two follows it. The third one comes now. A fourth sentence, then. "
            "The fifth is the last.")
    n = len(ts.split_text(text, 30))
    assert n >= 5
    same = dict(text=text, seed=61, speaker="Ryan", language="English", instruct="", first_take=1,
                max_segment_chars=30)
    prompt = ui_to_api.convert(load_wf("qwen3tts_streaming"), server.object_info)
    prompt["2"]["inputs"].update(same)
    pid, events = asyncio.run(_run_with_ws(server, prompt))
    stream = [e["data"] for e in events if e["type"] == EVENT]
    chunks = [d for d in stream if d["phase"] == "chunk"]
    assert stream[0]["segments"] == n and [d["seq"] for d in chunks] == list(range(len(chunks)))
    assert chunks[0]["samples"] <= 2 * SPF
    pcm = np.concatenate([np.frombuffer(base64.b64decode(d["pcm"]), "<f4") for d in chunks])
    assert pcm.size == n * FRAMES * SPF + (n - 1) * int(au.GAP_S * 24000)
    (path,) = client.output_files(server.wait(pid), server.base)
    streamed, _ = read_audio(path)
    assert np.max(np.abs(streamed - np.clip(pcm, -1, 1))) < 1e-4
    gen = run(server, _custom_prompt(server, **{**same, "takes": 1}))
    (picked,) = outputs_by_prefix(gen, server.base)["custom_voice_picked"]
    whole, _ = read_audio(picked)
    assert whole.shape == streamed.shape and np.abs(whole - streamed).max() <= 3 / 32768


def _custom_prompt(c, seed, **inputs):
    wf = load_wf("qwen3tts_custom_voice_takes")
    prompt = ui_to_api.convert(wf, c.object_info)
    prompt["2"]["inputs"].update(seed=seed, **inputs)
    return prompt


def test_interrupt_mid_run_then_next_run_works(server):
    async def on_message(m, session):
        if m["type"] == "progress" and m["data"].get("node") == "2" and not on_message.sent:
            on_message.sent = True
            async with session.post(f"{server.url}/interrupt") as r:
                assert r.status == 200
    on_message.sent = False
    pid, events = asyncio.run(_run_with_ws(server, _custom_prompt(server, 777), on_message))
    assert on_message.sent
    assert "execution_interrupted" in [e["type"] for e in events]
    entry = run(server, _custom_prompt(server, 778, takes=2))
    assert entry["status"]["status_str"] == "success"


def test_free_releases_the_engine(server):
    assert run(server, _custom_prompt(server, 901, takes=1))["status"]["status_str"] == "success"
    assert server.get("/qwen3tts_fast/engines")["engines"]
    status, _ = server.post("/free", {"unload_models": True, "free_memory": True})
    assert status == 200
    t_end = time.time() + 30
    while server.get("/qwen3tts_fast/engines")["engines"] and time.time() < t_end:
        time.sleep(0.5)
    assert server.get("/qwen3tts_fast/engines")["engines"] == []
    assert run(server, _custom_prompt(server, 902, takes=1))["status"]["status_str"] == "success"


def test_first_take_renders_one_take_of_a_run_alone(server):
    """Take 2 of a 4-take run == a 1-take run with first_take 2 (same seed), and the picked take says so.
    Same codes (tests/engine/test_cli.py checks them); the codec decodes a batch of 4 and of 1 with float differences
    of ~1e-6, which can move a 16-bit FLAC sample by one step."""
    four = run(server, _custom_prompt(server, 4242, takes=4))
    assert four["status"]["status_str"] == "success"
    pick = next(o for o in four["outputs"].values() if "qwen3tts_takes" in o)
    assert [(t["seed"], t["take"]) for t in pick["qwen3tts_takes"]] == [(4242, i) for i in range(4)]
    all_takes = sorted(outputs_by_prefix(four, server.base)["custom_voice_all_takes"])
    alone = run(server, _custom_prompt(server, 4242, takes=1, first_take=2))
    (picked,) = outputs_by_prefix(alone, server.base)["custom_voice_picked"]
    again = next(o for o in alone["outputs"].values() if "qwen3tts_takes" in o)["qwen3tts_takes"]
    assert [(t["seed"], t["take"]) for t in again] == [(4242, 2)]
    x, take2, take1 = (read_audio(p)[0] for p in (picked, all_takes[2], all_takes[1]))
    assert x.shape == take2.shape and np.abs(x - take2).max() <= 2 / 32768
    assert np.abs(x - take1).max() > 0.01


def test_long_text_rows_equal_its_segments_generated_alone_and_joined(server):
    """Long text: the segments decode as rows of one batch; the AUDIO equals each segment run on its own
    (seed + k, same first_take) joined by join_segments. 16-bit files: within a step or two."""
    import torch

    from tests.support._q3support import load_pure

    au, ts = load_pure("audio_utils"), load_pure("text_split")
    text = "A first sentence to say. Then a second one, a bit longer than that. And a third."
    pieces = ts.split_text(text, 30)  # the node's budget for max_segment_chars=30 with a 4096-position cache
    assert len(pieces) >= 3
    whole = run(server, _custom_prompt(server, 50, takes=2, first_take=1, text=text, max_segment_chars=30))
    got = [read_audio(p)[0] for p in sorted(outputs_by_prefix(whole, server.base)["custom_voice_all_takes"])]
    parts = []
    for k, piece in enumerate(pieces):
        alone = run(server, _custom_prompt(server, 50 + k, takes=2, first_take=1, text=piece))
        takes = [read_audio(p)[0] for p in sorted(outputs_by_prefix(alone, server.base)["custom_voice_all_takes"])]
        parts.append((torch.tensor(np.stack(takes)), [len(t) for t in takes]))
    want, lengths = au.join_segments(parts)
    for i in range(2):
        assert got[i].shape[0] == lengths[i] == len(pieces) * FRAMES * SPF + (len(pieces) - 1) * int(au.GAP_S * 24000)
        assert np.abs(got[i] - want[i, : lengths[i]].numpy()).max() <= 3 / 32768


def test_first_take_beyond_the_stream_range_is_a_node_error(server):
    entry = run(server, _custom_prompt(server, 7, takes=2, first_take=2**32 - 1))
    assert entry["status"]["status_str"] == "error"
    err = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert err["node_id"] == "2" and "CustomVoice: first_take" in err["exception_message"]
    assert "at most 4294967294" in err["exception_message"]


@pytest.mark.parametrize("change, where", [
    ({"speaker": "Nobody"}, "speaker"),
    ({"text": ""}, "text is empty"),
    ({"takes": 0}, "takes"),
])
def test_bad_widget_values_give_node_errors(server, change, where):
    status, body = server.queue(_custom_prompt(server, 5, **change))
    assert status == 400
    assert "2" in body["node_errors"] and where in json.dumps(body["node_errors"])
    server.get("/system_stats")


def test_wrong_model_type_is_a_node_error_naming_the_right_node(server):
    wf = load_wf("qwen3tts_voice_design")
    prompt = ui_to_api.convert(wf, server.object_info)
    prompt["1"]["inputs"]["checkpoint"] = "Qwen3-TTS-12Hz-0.6B-CustomVoice"
    entry = run(server, prompt)
    assert entry["status"]["status_str"] == "error"
    err = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert err["node_id"] == "2" and "CustomVoice" in err["exception_message"]
    assert run(server, _custom_prompt(server, 6, takes=1))["status"]["status_str"] == "success"


def test_script_on_a_base_model_names_the_voices_line(server):
    wf = load_wf("qwen3tts_script_dialogue")
    prompt = ui_to_api.convert(wf, server.object_info)
    prompt["1"]["inputs"]["checkpoint"] = "Qwen3-TTS-12Hz-0.6B-Base"
    entry = run(server, prompt)
    assert entry["status"]["status_str"] == "error"
    err = next(m[1] for m in entry["status"]["messages"] if m[0] == "execution_error")
    assert err["node_id"] == "2" and "voices line 1 (Ava = Vivian): on a Base model" in err["exception_message"]


def test_blend_voices_node_mixes_xvector_and_icl_and_saves(server):
    loader = {"checkpoint": "Qwen3-TTS-12Hz-0.6B-Base", "dtype": "auto", "cuda_graphs": "auto", "triton": "auto",
              "max_takes": 4}
    prompt = {
        "1": {"class_type": "Qwen3TTSFast_LoadQwen3TTS", "inputs": loader},
        "2": {"class_type": "LoadAudio", "inputs": {"audio": "qwen3tts_reference.ogg"}},
        "3": {"class_type": "Qwen3TTSFast_ExtractSpeakerEmbedding",
              "inputs": {"model": ["1", 0], "audio": ["2", 0], "batch_index": 0, "ref_text": ""}},
        "4": {"class_type": "Qwen3TTSFast_ExtractSpeakerEmbedding",
              "inputs": {"model": ["1", 0], "audio": ["2", 0], "batch_index": 0, "ref_text": "Some words."}},
        "5": {"class_type": "Qwen3TTSFast_BlendVoices",
              "inputs": {"voice_1": ["3", 0], "weight_1": 1.0, "voice_2": ["4", 0], "weight_2": 3.0}},
        "6": {"class_type": "Qwen3TTSFast_SaveVoice", "inputs": {"voice": ["5", 0], "name": "blended_test",
                                                                  "overwrite": True}},
    }
    entry = run(server, prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    assert entry["outputs"]["5"]["text"] == ["voice_1 25%, voice_2 75% (voice_2: ICL, blended by x-vector only)"]
    from engine import Voice

    saved = Voice.load(server.base / "models" / "qwen3_tts" / "voices" / "blended_test.safetensors")
    assert not saved.is_icl and saved.width > 0


def test_script_on_a_base_model_with_xvector_and_icl_voices_and_split_lines(server):
    """Base model: names map to VOICE inputs; lines longer than max_segment_chars are split and joined."""
    from tests.support._q3support import load_pure

    split_text = load_pure("text_split").split_text
    loader = {"checkpoint": "Qwen3-TTS-12Hz-0.6B-Base", "dtype": "auto", "cuda_graphs": "auto", "triton": "auto",
              "max_takes": 4}
    lines = ["Ava: One short line.", "Ben: A longer line. It has two sentences, and a clause or two."]
    prompt = {
        "1": {"class_type": "Qwen3TTSFast_LoadQwen3TTS", "inputs": loader},
        "2": {"class_type": "LoadAudio", "inputs": {"audio": "qwen3tts_reference.ogg"}},
        "3": {"class_type": "Qwen3TTSFast_ExtractSpeakerEmbedding",
              "inputs": {"model": ["1", 0], "audio": ["2", 0], "batch_index": 0, "ref_text": ""}},
        "4": {"class_type": "Qwen3TTSFast_ExtractSpeakerEmbedding",
              "inputs": {"model": ["1", 0], "audio": ["2", 0], "batch_index": 0, "ref_text": "Some words."}},
        "5": {"class_type": "Qwen3TTSFast_Script",
              "inputs": {"model": ["1", 0], "script": "\n".join(lines), "voices": "Ava = voice_1\nBen = voice 2",
                         "language": "English", "seed": 3, "line_gap": 0.25, "names_in_subtitles": False,
                         "voice_1": ["3", 0], "voice_2": ["4", 0], "max_segment_chars": 25}},
        "6": {"class_type": "Qwen3TTSFast_PickTake", "inputs": {"audio": ["5", 1], "index": 0}},
        "8": {"class_type": "SaveAudio", "inputs": {"audio": ["6", 0], "filename_prefix": "qwen3tts/script_line"}},
        "7": {"class_type": "Qwen3TTSFast_SaveSubtitles",
              "inputs": {"subtitles": ["5", 2], "filename_prefix": "qwen3tts/script_lines"}},
    }
    entry = run(server, prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    srt_out = entry["outputs"]["7"]["subtitles"][0]
    cues = srt_cues((server.base / "output" / srt_out["subfolder"] / srt_out["filename"]).read_text())
    texts = [line.split(": ", 1)[1] for line in lines]
    assert [c[2] for c in cues] == texts  # names_in_subtitles off
    pieces = [len(split_text(t, 25)) for t in texts]
    assert pieces[0] == 1 and pieces[1] >= 3
    # every piece is 12 frames (960 ms); pieces of one line are joined with the generators' 120 ms gap
    assert [end - start for start, end, _ in cues] == [n * 960 + (n - 1) * 120 for n in pieces]
    assert cues[1][0] - cues[0][1] == 250
    takes = entry["outputs"]["6"]["qwen3tts_takes"]  # the lines output carries each line's length
    assert [t["samples"] for t in takes] == [(e - s) * 24 for s, e, _ in cues]
    (line0,) = [f for f in client.output_files(entry, server.base) if "script_line" in f.name]
    assert read_audio(line0)[0].size == (cues[0][1] - cues[0][0]) * 24


def test_script_on_a_voice_design_model_uses_descriptions(server):
    wf = load_wf("qwen3tts_script_dialogue")
    prompt = ui_to_api.convert(wf, server.object_info)
    prompt["1"]["inputs"]["checkpoint"] = "Qwen3-TTS-12Hz-1.7B-VoiceDesign"
    prompt["2"]["inputs"]["voices"] = ("Ava = A bright young woman.\nBen = A tired old man, slow.\n"
                                       "Cleo = A proud craftswoman.")
    entry = run(server, prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    files = outputs_by_prefix(entry, server.base)
    check_dialogue(entry, server.base, files["dialogue"][0])
