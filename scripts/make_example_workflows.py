"""Write example_workflows/*.json (UI format) from compact specs, against a live /object_info.

    python scripts/make_example_workflows.py OBJECT_INFO.json

Widget order, control values and socket lists are taken from /object_info, so the files match the node
schemas exactly. Thumbnails (.jpg) are screenshots from the newest frontend: `scripts/screenshot_workflows.py`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ui_to_api import is_widget  # this script runs from scripts/, beside ui_to_api.py

OUT = Path(__file__).resolve().parents[1] / "example_workflows"
P = "Qwen3TTSFast_"
REF_TEXT = "The quick brown fox jumps over the lazy dog. Then it runs away."
LINE = "Hello! This is Qwen3-TTS inside ComfyUI. Listen to every take, then keep the best one."
LOADER = {"dtype": "auto", "cuda_graphs": "auto", "triton": "auto", "max_takes": 4}
SIZES = {P + "LoadQwen3TTS": [330, 230], P + "CustomVoice": [400, 420], P + "VoiceDesign": [400, 420],
         P + "VoiceClone": [400, 420], P + "StreamChunks": [400, 470], P + "PickTake": [420, 260],
         P + "ExtractSpeakerEmbedding": [360, 200], P + "SaveVoice": [320, 130], P + "LoadVoice": [320, 130],
         P + "Script": [460, 560], P + "SaveSubtitles": [320, 110], P + "BlendVoices": [320, 260],
         "LoadAudio": [320, 160], "SaveAudio": [320, 120]}
DIALOGUE = """Ava: Did you hear that noise last night?
Ben [sleepy]: Only the rain. Go back to sleep.
[pause 0.8s]
Cleo: It was not the rain. It was me, fixing the roof.
Ava: At three in the morning?
[pause 0.5s]
Cleo [proudly]: Someone had to."""
CAST = "Ava = Vivian\nBen = Ryan\nCleo = Serena"


FIXED = ("The seed is 'fixed': queueing again with nothing changed re-uses the result instead of "
         "generating anew. For new takes change the seed (or set it to randomize).")
NOTE_WIDTH, NOTE_CHARS_PER_LINE, NOTE_LINE_PX = 360, 44, 20  # the Note never gets wider than 360 px


def note(text):
    return {"type": "Note", "widgets": {"text": text}}


def note_size(text: str) -> list:
    """Width fixed at NOTE_WIDTH; height from the text's length, so the Note needs no room to the side."""
    lines = -(-len(text) // NOTE_CHARS_PER_LINE)
    return [NOTE_WIDTH, max(160, 40 + NOTE_LINE_PX * lines)]


WORKFLOWS = {
    "qwen3tts_custom_voice_takes": {
        "nodes": {
            1: {"type": P + "LoadQwen3TTS", "widgets": {"checkpoint": "Qwen3-TTS-12Hz-0.6B-CustomVoice", **LOADER}},
            2: {"type": P + "CustomVoice", "widgets": {"text": LINE, "speaker": "Ryan", "instruct": "",
                                                       "language": "English", "seed": 42, "takes": 4}},
            3: {"type": P + "PickTake", "widgets": {"index": 0}},
            4: {"type": "SaveAudio", "widgets": {"filename_prefix": "qwen3tts/custom_voice_picked"}},
            5: {"type": "SaveAudio", "widgets": {"filename_prefix": "qwen3tts/custom_voice_all_takes"}},
            6: note("Four takes in one batch. PickTake shows a player, seed and take number per take: press "
                    "'use this take' on the best one and queue again - only PickTake re-runs, because the seed "
                    "is 'fixed' (a seed left on randomize would make four new takes; 'use this take' pins it "
                    "and says so). To render one take alone later, use its seed with takes 1 and first_take = "
                    "its take number."),
        },
        "links": [(1, 0, 2, "model"), (2, 0, 3, "audio"), (3, 0, 4, "audio"), (2, 0, 5, "audio")],
    },
    "qwen3tts_voice_design": {
        "nodes": {
            1: {"type": P + "LoadQwen3TTS", "widgets": {"checkpoint": "Qwen3-TTS-12Hz-1.7B-VoiceDesign", **LOADER}},
            2: {"type": P + "VoiceDesign", "widgets": {
                "text": "Welcome back. Today we design a voice from a description alone.",
                "instruct": "A warm, low male voice, middle-aged, calm and slightly amused, speaking slowly.",
                "language": "English", "seed": 7, "takes": 2}},
            3: {"type": P + "PickTake", "widgets": {"index": 0}},
            4: {"type": "SaveAudio", "widgets": {"filename_prefix": "qwen3tts/voice_design"}},
            5: note("VoiceDesign: describe the voice in 'instruct' (gender, age, timbre, mood, pace). " + FIXED),
        },
        "links": [(1, 0, 2, "model"), (2, 0, 3, "audio"), (3, 0, 4, "audio")],
    },
    "qwen3tts_voice_clone_xvector": {
        "nodes": {
            1: {"type": P + "LoadQwen3TTS", "widgets": {"checkpoint": "Qwen3-TTS-12Hz-0.6B-Base", **LOADER}},
            2: {"type": "LoadAudio", "widgets": {"audio": "qwen3tts_reference.ogg"}},
            3: {"type": P + "ExtractSpeakerEmbedding", "widgets": {"batch_index": 0, "ref_text": ""}},
            4: {"type": P + "VoiceClone", "widgets": {"text": "This sentence is spoken in the cloned voice.",
                                                      "language": "English", "seed": 3, "takes": 2}},
            5: {"type": P + "PickTake", "widgets": {"index": 0}},
            6: {"type": "SaveAudio", "widgets": {"filename_prefix": "qwen3tts/clone_xvector"}},
            7: note("x-vector cloning: only the speaker embedding of the reference is used (ref_text empty). "
                    "Copy example_workflows/qwen3tts_reference.ogg to ComfyUI/input/ or load your own clip. " + FIXED),
        },
        "links": [(1, 0, 3, "model"), (2, 0, 3, "audio"), (1, 0, 4, "model"), (3, 0, 4, "voice"),
                  (4, 0, 5, "audio"), (5, 0, 6, "audio")],
    },
    "qwen3tts_voice_clone_icl": {
        "nodes": {
            1: {"type": P + "LoadQwen3TTS", "widgets": {"checkpoint": "Qwen3-TTS-12Hz-0.6B-Base", **LOADER}},
            2: {"type": "LoadAudio", "widgets": {"audio": "qwen3tts_reference.ogg"}},
            3: {"type": P + "ExtractSpeakerEmbedding", "widgets": {"batch_index": 0, "ref_text": REF_TEXT}},
            4: {"type": P + "VoiceClone", "widgets": {"text": "With the transcript, the clone follows the reference "
                                                              "more closely.", "language": "English", "seed": 5,
                                                      "takes": 2}},
            5: {"type": P + "PickTake", "widgets": {"index": 0}},
            6: {"type": "SaveAudio", "widgets": {"filename_prefix": "qwen3tts/clone_icl"}},
            7: note("ICL cloning: ref_text is the exact transcript of the reference clip. " + FIXED),
        },
        "links": [(1, 0, 3, "model"), (2, 0, 3, "audio"), (1, 0, 4, "model"), (3, 0, 4, "voice"),
                  (4, 0, 5, "audio"), (5, 0, 6, "audio")],
    },
    "qwen3tts_save_and_load_voice": {
        "nodes": {
            1: {"type": P + "LoadQwen3TTS", "widgets": {"checkpoint": "Qwen3-TTS-12Hz-0.6B-Base", **LOADER}},
            2: {"type": "LoadAudio", "widgets": {"audio": "qwen3tts_reference.ogg"}},
            3: {"type": P + "ExtractSpeakerEmbedding", "widgets": {"batch_index": 0, "ref_text": REF_TEXT}},
            4: {"type": P + "SaveVoice", "widgets": {"name": "qwen3tts_example_voice", "overwrite": True}},
            5: {"type": P + "LoadVoice", "widgets": {"voice_name": "qwen3tts_example_voice"}},
            6: {"type": P + "VoiceClone", "widgets": {"text": "This voice was saved to disk and loaded again.",
                                                      "language": "English", "seed": 11, "takes": 1}},
            7: {"type": "SaveAudio", "widgets": {"filename_prefix": "qwen3tts/saved_voice"}},
            8: note("SaveVoice writes models/qwen3_tts/voices/<name>.safetensors. Its 'name' output feeds "
                    "LoadVoice so the load runs after the save; in other workflows just pick the voice. " + FIXED),
        },
        "links": [(1, 0, 3, "model"), (2, 0, 3, "audio"), (3, 0, 4, "voice"), (1, 0, 5, "model"),
                  (4, 0, 5, "name_override"), (1, 0, 6, "model"), (5, 0, 6, "voice"), (6, 0, 7, "audio")],
    },
    "qwen3tts_streaming": {
        "nodes": {
            1: {"type": P + "LoadQwen3TTS", "widgets": {"checkpoint": "Qwen3-TTS-12Hz-0.6B-CustomVoice", **LOADER}},
            2: {"type": P + "StreamChunks", "widgets": {
                "text": "Streaming starts playing while the rest is still being generated.", "chunk_frames": 4,
                "language": "English", "seed": 1, "speaker": "Serena", "instruct": ""}},
            3: {"type": "SaveAudio", "widgets": {"filename_prefix": "qwen3tts/streaming"}},
            4: note("The Stream node's player plays chunks as they arrive and shows time to first audio (TTFA) "
                    "and the real-time factor (RTF). " + FIXED),
        },
        "links": [(1, 0, 2, "model"), (2, 0, 3, "audio")],
    },
    "qwen3tts_script_dialogue": {
        "nodes": {
            1: {"type": P + "LoadQwen3TTS", "widgets": {"checkpoint": "Qwen3-TTS-12Hz-0.6B-CustomVoice", **LOADER}},
            2: {"type": P + "Script", "widgets": {"script": DIALOGUE, "voices": CAST, "language": "English",
                                                  "seed": 21, "line_gap": 0.3, "names_in_subtitles": True}},
            3: {"type": "SaveAudio", "widgets": {"filename_prefix": "qwen3tts/dialogue"}},
            4: {"type": P + "SaveSubtitles", "widgets": {"filename_prefix": "qwen3tts/dialogue_subtitles"}},
            5: note("Three characters, one batch. 'Name: text' per line, [pause 0.8s] on its own line, "
                    "'Name [instruction]: text' for a line's style (honoured by 1.7B CustomVoice and VoiceDesign). "
                    "The voices table maps names to preset speakers; on a Base model to voice_1..voice_4. " + FIXED),
        },
        "links": [(1, 0, 2, "model"), (2, 0, 3, "audio"), (2, 2, 4, "subtitles")],
    },
}


def _inputs(info):
    order = info.get("input_order") or {k: list(v) for k, v in info["input"].items()}
    for section in ("required", "optional"):
        for name in order.get(section, []):
            yield name, info["input"][section][name]


def build(spec: dict, object_info: dict) -> dict:
    links_out, nodes = [], []
    in_links: dict[tuple, int] = {}
    out_links: dict[tuple, list] = {}
    for link_id, (src, slot, dst, name) in enumerate(spec["links"], start=1):
        in_links[(dst, name)] = link_id
        out_links.setdefault((src, slot), []).append(link_id)
    x = 40
    for order, (nid, n) in enumerate(spec["nodes"].items()):
        typ = n["type"]
        size = note_size(n["widgets"]["text"]) if typ == "Note" else SIZES.get(typ, [320, 160])
        node = {"id": nid, "type": typ, "pos": [x if typ != "Note" else 40, 60 if typ != "Note" else 560],
                "size": size, "flags": {}, "order": order, "mode": 0,
                "inputs": [], "outputs": [], "properties": {"Node name for S&R": typ}, "widgets_values": []}
        x += SIZES.get(typ, [320, 160])[0] + 40
        if typ == "Note":
            node["widgets_values"] = [n["widgets"]["text"]]
            node["properties"] = {"text": ""}
            nodes.append(node)
            continue
        info = object_info[typ]
        for name, ispec in _inputs(info):
            link = in_links.get((nid, name))
            if is_widget(ispec):
                value = n["widgets"].get(name, (ispec[1] if len(ispec) > 1 else {}).get("default"))
                node["widgets_values"].append(value)
                if (ispec[1] if len(ispec) > 1 else {}).get("control_after_generate"):
                    node["widgets_values"].append("fixed")  # see FIXED
                entry = {"name": name, "type": "COMBO" if isinstance(ispec[0], list) else ispec[0],
                         "widget": {"name": name}, "link": link}
                if link is not None or typ != "LoadAudio":
                    node["inputs"].append(entry)
            else:
                node["inputs"].append({"name": name, "type": ispec[0], "link": link})
        for slot, (otype, oname) in enumerate(zip(info["output"], info["output_name"])):
            node["outputs"].append({"name": oname, "type": otype, "links": out_links.get((nid, slot), []),
                                    "slot_index": slot})
        if typ == "LoadAudio":
            node["widgets_values"] += [None, None]
        nodes.append(node)
    for (dst, name), link_id in in_links.items():
        src, slot = next((s, sl) for (s, sl), ids in out_links.items() if link_id in ids)
        dnode = next(nd for nd in nodes if nd["id"] == dst)
        to_slot = next(i for i, e in enumerate(dnode["inputs"]) if e["name"] == name)
        otype = next(nd for nd in nodes if nd["id"] == src)["outputs"][slot]["type"]
        links_out.append([link_id, src, slot, dst, to_slot, otype])
    links_out.sort()
    return {"last_node_id": max(spec["nodes"]), "last_link_id": len(links_out), "nodes": nodes,
            "links": links_out, "groups": [], "config": {},
            "extra": {"ds": {"scale": 0.8, "offset": [0, 0]}}, "version": 0.4}


def main(object_info_path: str) -> None:
    object_info = json.loads(Path(object_info_path).read_text())
    for name, spec in WORKFLOWS.items():
        (OUT / f"{name}.json").write_text(json.dumps(build(spec, object_info), separators=(",", ":")) + "\n")
        print("wrote", OUT / f"{name}.json")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
