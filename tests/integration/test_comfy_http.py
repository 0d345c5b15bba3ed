"""Reliability over HTTP in a real headless ComfyUI (as tests/integration/test_e2e_http.py starts it):

* bad widget values are refused with an error naming the widget, and the server stays up;
* voice names with '../', absolute paths, backslashes, NUL, 300 characters (typed, or linked from a String
  node) are refused on save and on load, and no file is ever written outside models/qwen3_tts/voices/;
* 20 /interrupt mid-run and 10 /free cycles, each followed by a normal run: the server stays up and its RSS
  stays bounded."""
from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from tests.support.procstats import rss_mb

CUSTOM, DESIGN, BASE = "Qwen3-TTS-12Hz-0.6B-CustomVoice", "Qwen3-TTS-12Hz-1.7B-VoiceDesign", "Qwen3-TTS-12Hz-0.6B-Base"
P = "Qwen3TTSFast_"
RSS_GROWTH = 0.10

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- prompts (API format) --------------------------------------------------------------------------------

def _loader(ckpt, **kw):
    return {"class_type": P + "LoadQwen3TTS",
            "inputs": {"checkpoint": ckpt, "dtype": "auto", "cuda_graphs": "auto", "triton": "auto", "max_takes": 4,
                       **kw}}


def _custom(seed, loader=None, **kw):
    return {"1": loader or _loader(CUSTOM),
            "2": {"class_type": P + "CustomVoice",
                  "inputs": {"model": ["1", 0], "text": "Reliability over HTTP.", "speaker": "Ryan",
                             "language": "English", "seed": seed, "takes": 1, **kw}},
            "3": {"class_type": "PreviewAudio", "inputs": {"audio": ["2", 0]}}}


def _stream(seed, **kw):
    return {"1": _loader(CUSTOM),
            "2": {"class_type": P + "StreamChunks",
                  "inputs": {"model": ["1", 0], "text": "Streaming over HTTP.", "chunk_frames": 2, "language": "English",
                             "seed": seed, "speaker": "Serena", **kw}},
            "3": {"class_type": "PreviewAudio", "inputs": {"audio": ["2", 0]}}}


def _voice(name=None, linked=False, seed=0, **extract):
    """Base loader -> LoadAudio -> ExtractSpeakerEmbedding -> SaveVoice(name)."""
    p = {"1": _loader(BASE),
         "2": {"class_type": "LoadAudio", "inputs": {"audio": "qwen3tts_reference.ogg"}},
         "3": {"class_type": P + "ExtractSpeakerEmbedding",
               "inputs": {"model": ["1", 0], "audio": ["2", 0], "batch_index": 0, "ref_text": f"Seed {seed}.",
                          **extract}},
         "4": {"class_type": P + "SaveVoice", "inputs": {"voice": ["3", 0], "name": name, "overwrite": True}}}
    if linked:
        p["5"] = {"class_type": "PrimitiveString", "inputs": {"value": name}}
        p["4"]["inputs"]["name"] = ["5", 0]
    return p


def _load_voice(name, linked=False):
    """Base loader -> LoadVoice(name) -> VoiceClone -> PreviewAudio."""
    p = {"1": _loader(BASE),
         "4": {"class_type": P + "LoadVoice", "inputs": {"model": ["1", 0], "voice_name": name}},
         "6": {"class_type": P + "VoiceClone",
               "inputs": {"model": ["1", 0], "voice": ["4", 0], "text": "Cloned.", "language": "English", "seed": 1,
                          "takes": 1}},
         "7": {"class_type": "PreviewAudio", "inputs": {"audio": ["6", 0]}}}
    if linked:
        p["5"] = {"class_type": "PrimitiveString", "inputs": {"value": name}}
        p["4"]["inputs"].update(voice_name="ok_voice", name_override=["5", 0])
    return p


def _outcome(c, prompt) -> tuple[str, str]:
    """('refused', node errors) at validation, or the run's status ('success' / 'error', error message)."""
    status, body = c.queue(prompt)
    if status == 400:
        return "refused", json.dumps(body)
    assert status == 200, body
    entry = c.wait(body["prompt_id"], timeout=120)
    msgs = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    return entry["status"]["status_str"], json.dumps(msgs)


def _alive(c):
    assert c.proc.poll() is None, "ComfyUI exited"
    c.get("/system_stats")


# -- bad widget values -----------------------------------------------------------------------------------

BAD_WIDGETS = [  # (name, prompt builder, words the error must contain)
    ("takes 0", lambda s: _custom(s, takes=0), "takes"),
    ("takes 17", lambda s: _custom(s, takes=17), "takes"),
    ("takes text", lambda s: _custom(s, takes="many"), "takes"),
    ("takes above max_takes", lambda s: _custom(s, takes=8), "max_takes"),
    ("seed negative", lambda s: _custom(-5), "seed"),
    ("temperature NaN", lambda s: _custom(s, temperature=float("nan")), "temperature"),
    ("temperature inf", lambda s: _custom(s, temperature=float("inf")), "temperature"),
    ("temperature 99", lambda s: _custom(s, temperature=99.0), "temperature"),
    ("top_p -0.5", lambda s: _custom(s, top_p=-0.5), "top_p"),
    ("top_k huge", lambda s: _custom(s, top_k=10**12), "top_k"),
    ("max_new_tokens 0", lambda s: _custom(s, max_new_tokens=0), "max_new_tokens"),
    ("max_segment_chars 1", lambda s: _custom(s, max_segment_chars=1), "max_segment_chars"),
    ("do_sample maybe", lambda s: _custom(s, do_sample="maybe"), "do_sample"),
    ("language Klingon", lambda s: _custom(s, language="Klingon"), "language"),
    ("speaker path", lambda s: _custom(s, speaker="../../etc/passwd"), "speaker"),
    ("text empty", lambda s: _custom(s, text=""), "text is empty"),
    ("text blank", lambda s: _custom(s, text=" \n\t "), "text is empty"),
    ("dtype fp8", lambda s: _custom(s, loader=_loader(CUSTOM, dtype="fp8")), "dtype"),
    ("max_takes 0", lambda s: _custom(s, loader=_loader(CUSTOM, max_takes=0)), "max_takes"),
    ("checkpoint ../", lambda s: _custom(s, loader=_loader("../../../etc")), "not found"),
    ("checkpoint absolute", lambda s: _custom(s, loader=_loader("/etc")), "not found"),
    ("cuda_graphs on CPU", lambda s: _custom(s, loader=_loader(CUSTOM, cuda_graphs="on")), "CUDA"),
    ("chunk_frames 0", lambda s: _stream(s, chunk_frames=0), "chunk_frames"),
    ("batch_index 99", lambda s: _voice("bi", seed=s, batch_index=99), "batch_index"),
    ("batch_index past the batch", lambda s: _voice("bi", seed=s, batch_index=3), "batch"),
    ("wrong checkpoint type", lambda s: _custom(s, loader=_loader(DESIGN)), "VoiceDesign"),
]


def test_bad_widget_values_give_clear_errors_and_the_server_stays_up(server, figure):
    outcomes, unclear, at_run = {}, [], []
    for i, (name, build, words) in enumerate(BAD_WIDGETS):
        kind, text = _outcome(server, build(1000 + i))
        outcomes[kind] = outcomes.get(kind, 0) + 1
        if kind == "error":
            at_run.append(name)
        if kind == "success" or words.lower() not in text.lower():
            unclear.append((name, kind, text[:300]))
        _alive(server)
    figure(cases=len(BAD_WIDGETS), **outcomes, unclear=len(unclear), refused_at_run=at_run)
    assert unclear == []
    assert _outcome(server, _custom(1))[0] == "success"


# -- voice names and the file tree ----------------------------------------------------------------------

def _snapshot(root: Path) -> dict:
    """{relative path: (size, mtime_ns)} of every file and link under root, ComfyUI's own log/user/temp aside."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir.parts[:1] in (("user",), ("temp",)):
            continue
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]  # custom_nodes link
        for f in filenames:
            p = Path(dirpath) / f
            st = p.lstat()
            out[str(rel_dir / f)] = (st.st_size, st.st_mtime_ns)
    out.pop("comfyui.log", None)
    return out


def test_hostile_voice_names_are_refused_and_nothing_is_written_outside_voices(server, tmp_path, figure):
    voices = server.base / "models" / "qwen3_tts" / "voices"
    outside = tmp_path / "outside"
    outside.mkdir()
    trap = outside / "trap_target"
    # A link planted where a naive save would write its temporary file must not be followed.
    os.symlink(trap, voices / "trap.safetensors.tmp")
    names = ["../evil", "../../evil", "..", "../../../../tmp/evil", "voices/../evil", "a/b", str(outside / "abs"),
             "/etc/evil", "..\\evil", "a\\b", "C:\\evil", "x" * 300, "", "   ", ".hidden", "-dash"]
    # Control characters are cleaned out of a name before anything else (paths.clean_name): these save under the
    # cleaned name, inside voices/, and can be loaded back by it.
    cleaned = {"nul\x00byte": "nulbyte", "new\nline": "new line"}
    before_tree, before_outside = _snapshot(server.base), sorted(os.listdir(outside))
    results, accepted = [], []
    for i, name in enumerate(names):
        for how, prompt in (("save", _voice(name, seed=i)), ("save linked", _voice(name, linked=True, seed=i)),
                            ("load", _load_voice(name)), ("load linked", _load_voice(name, linked=True))):
            kind, text = _outcome(server, prompt)
            results.append(kind)
            if kind == "success" or not any(w in text for w in ("voice name", "not found")):
                accepted.append((how, name[:40], kind, text[:300]))
        _alive(server)
    for i, (name, clean) in enumerate(cleaned.items()):
        assert _outcome(server, _voice(name, seed=50 + i))[0] == "success", name
        assert (voices / f"{clean}.safetensors").is_file()
        assert _outcome(server, _load_voice(clean))[0] == "success", clean
    assert _outcome(server, _voice("ok_voice", seed=99))[0] == "success"
    assert _outcome(server, _voice("trap", seed=98))[0] == "success"
    assert _outcome(server, _load_voice("ok_voice"))[0] == "success"
    changed = {k for k, v in _snapshot(server.base).items() if before_tree.get(k) != v}
    stray = sorted(k for k in changed if not k.startswith("models/qwen3_tts/voices/"))
    voice_files = sorted(os.listdir(voices))
    figure(names=len(names), attempts=len(results), refused_at_validation=results.count("refused"),
           refused_at_run=results.count("error"), accepted=len(accepted), files_written=sorted(changed),
           files_outside_voices=len(stray))
    assert accepted == []
    assert stray == []
    assert not trap.exists() and sorted(os.listdir(outside)) == before_outside
    assert {"ok_voice.safetensors", "trap.safetensors", "nulbyte.safetensors", "new line.safetensors"} <= set(voice_files)
    assert [f for f in voice_files if f.endswith(".tmp") and f != "trap.safetensors.tmp"] == []


# -- /interrupt and /free --------------------------------------------------------------------------------

async def _interrupted_run(c, prompt, node="2", timeout=120):
    """Queue, POST /interrupt at the node's first progress event; returns the final event type."""
    import aiohttp

    async with aiohttp.ClientSession() as s, s.ws_connect(f"ws://127.0.0.1:{c.port}/ws?clientId={c.client_id}") as ws:
        async with s.post(f"{c.url}/prompt", json={"prompt": prompt, "client_id": c.client_id}) as r:
            body = await r.json()
            assert r.status == 200, body
        pid, sent, t_end = body["prompt_id"], False, time.time() + timeout
        while time.time() < t_end:
            msg = await ws.receive(timeout=timeout)
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            m = json.loads(msg.data)
            if m["type"] == "progress" and m["data"].get("node") == node and not sent:
                sent = True
                async with s.post(f"{c.url}/interrupt") as r:
                    assert r.status == 200
            if m["type"] in ("execution_success", "execution_error", "execution_interrupted") and \
                    m["data"].get("prompt_id") == pid:
                if m["type"] == "execution_error":
                    return f"execution_error: {m['data'].get('exception_message', '')[:200]}"
                return m["type"] if sent else "not interrupted"
    raise TimeoutError("no end event")


def _engines(c):
    return c.get("/qwen3tts_fast/engines")["engines"]


def test_interrupts_and_frees_keep_the_server_up_with_bounded_rss(server, figure):
    pid = server.proc.pid
    samples, ends, normal = [], {}, []
    long = {"max_new_tokens": 400}  # long enough that the interrupt always lands mid-run
    for i in range(20):
        prompt = _stream(5000 + i, **long) if i % 2 else _custom(5000 + i, **long)
        end = asyncio.run(_interrupted_run(server, prompt))
        ends[end] = ends.get(end, 0) + 1
        normal.append(_outcome(server, _stream(6000 + i) if i % 2 else _custom(6000 + i))[0])
        _alive(server)
        samples.append(rss_mb(pid))
    frees = 0
    for i in range(10):
        status, _ = server.post("/free", {"unload_models": True, "free_memory": True})
        assert status == 200
        t_end = time.time() + 30
        while _engines(server) and time.time() < t_end:
            time.sleep(0.2)
        frees += not _engines(server)
        normal.append(_outcome(server, _custom(7000 + i))[0])
        _alive(server)
        samples.append(rss_mb(pid))
    warm = samples[4]
    peak = max(samples[4:])
    figure(interrupts=20, ends=ends, frees=frees, normal_runs=len(normal), normal_ok=normal.count("success"),
           rss_first_mb=round(samples[0], 1), rss_warm_mb=round(warm, 1), rss_peak_mb=round(peak, 1),
           rss_growth_pct=round(100 * (peak / warm - 1), 2))
    assert ends == {"execution_interrupted": 20}, f"ends of the interrupted runs: {ends}; see {server.base / 'comfyui.log'}"
    assert frees == 10
    assert normal.count("success") == len(normal) == 30
    assert peak <= warm * (1 + RSS_GROWTH), f"server RSS grew from {warm:.0f} to {peak:.0f} MB"
