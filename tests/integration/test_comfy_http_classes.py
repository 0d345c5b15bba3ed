"""The robustness classes over HTTP: a real headless ComfyUI 0.3.75 with the pack (one start for the module), API
prompts posted to /prompt. Every bad case ends in an HTTP 400 whose node errors name the input, or in an execution
error of that node whose message starts with the node's name, names the input or file and says what to do; the
server answers after each case, and a normal run succeeds at the end.

* checkpoint configs: folders whose config.json, generation_config.json or codec config has a field of the wrong
  type, or whose config.json is a FIFO or a directory, sit beside the good checkpoints from the start: every node is
  registered, CustomVoice's speakers are whole, each bad folder is listed and choosing it names its file and field;
* output paths: SaveVoice onto a directory or a FIFO, a name too long or of a NUL byte only (typed and linked);
  SaveSubtitles with a prefix too long;
* silent overwrites: voice names that differ from a saved voice only by whitespace or control characters are
  refused and the voice is kept; SaveSubtitles with an empty prefix or one ending in '/' writes a new file each run;
* script totals and widget ranges: Script with a NaN line gap (JSON NaN, which Python's json reads) and with pauses
  past the total cap; values one step past the widgets' ranges; temperature 0, inside the widget, outside the
  engine; max_new_tokens 1 runs;
* degenerate numbers: BlendVoices with vanishing or NaN weights; a reference text of invisible characters only;
* load arguments: LoadQwen3TTS with what HTTP can carry past the widgets (max_takes out of range or not a number,
  unknown dtype, switch, codec or download, a checkpoint name with a NUL byte).
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine import errors
from tests.support._q3support import PACK

CUSTOM, BASE = "Qwen3-TTS-12Hz-0.6B-CustomVoice", "Qwen3-TTS-12Hz-0.6B-Base"
P = "Qwen3TTSFast_"
CONFIGS, OUTPUT, OVERWRITE = "1 checkpoint configs", "2 output paths", "3 silent overwrites"
SIZE, LYING = "4 size before work", "8 lying files"
TOTALS, RANGES, NUMBERS, LOAD = "5 script totals", "6 widget ranges", "7 degenerate numbers", "9 load arguments"
EXTRA_SPEAKER = "my_fine_tuned_speaker"  # a good fine-tuned checkpoint's speaker, listed beside the bad folders
# Error types a node may end with: the project's typed errors, or the RuntimeError the nodes wrap them in (with the
# node's name first). A TypeError, KeyError, IndexError ... is a raw traceback.
TYPED = {name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, Exception)}
TYPED.add("RuntimeError")
SRT = "1\n00:00:00,000 --> 00:00:01,000\nAlice: hi\n"


# -- the base directory: bad checkpoint folders and special files beside the good ones ------------------

def _linked_copy(src: Path, dst: Path, real: tuple = ()) -> None:
    """dst holds links to src's entries; the entries named in `real` (sub-folders) are folders of links instead."""
    dst.mkdir()
    for entry in src.iterdir():
        if entry.name in real:
            _linked_copy(entry, dst / entry.name)
        else:
            os.symlink(entry, dst / entry.name)


def _with_field(path: Path, keys: tuple, value) -> None:
    """Replace the link at path by the file with one field set (keys: the path to the field)."""
    doc = json.loads(path.read_text())
    node = doc
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    path.unlink()
    path.write_text(json.dumps(doc))


def _config_dir(d: Path) -> None:
    (d / "config.json").unlink()
    (d / "config.json").mkdir()


def _config_fifo(d: Path) -> None:
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")


# folder -> (damage, what the LoadQwen3TTS message must say)
BAD_FOLDERS = {
    "bad-vocab-size-text": (lambda d: _with_field(d / "config.json", ("talker_config", "vocab_size"), "seven"),
                            r"config\.json.*'vocab_size' must be .*restore it"),
    "bad-speaker-id-text": (lambda d: _with_field(d / "config.json", ("talker_config", "spk_id"), {"bad_speaker": "7"}),
                            r"config\.json.*spk_id.*bad_speaker.*restore it"),
    "bad-generation-max-text": (lambda d: _with_field(d / "generation_config.json", ("max_new_tokens",), "many"),
                                r"generation_config\.json.*'max_new_tokens' must be .*restore it"),
    "bad-codec-layers-list": (lambda d: _with_field(d / "speech_tokenizer" / "config.json",
                                                    ("decoder_config", "num_hidden_layers"), [8]),
                              r"speech_tokenizer/config\.json.*'num_hidden_layers' must be .*restore it"),
    "bad-config-fifo": (_config_fifo, r"config\.json is a FIFO.*not a file.*Download the whole"),
    "bad-config-directory": (_config_dir, r"config\.json is a directory.*not a file.*Download the whole"),
}
SPECIAL_VOICES = {"dirvoice": Path.mkdir, "fifovoice": os.mkfifo}  # voices/<name>.safetensors made as these


def _empty_merges(d: Path) -> None:
    (d / "merges.txt").unlink()
    (d / "merges.txt").write_text("")


def _big_voice(path: Path) -> None:
    with open(path, "wb") as fh:  # sparse: 17 MB on paper, nothing on disk
        fh.truncate(17 << 20)


def _lying_voice(path: Path) -> None:
    path.write_bytes((10**9).to_bytes(8, "little") + b"{}" + bytes(90))  # a header "of 1 GB" in a 100-byte file


LYING_FOLDERS = {"bad-empty-merges": (_empty_merges, r"merges\.txt holds no merges.*Re-download merges\.txt")}
# voices/<name>.safetensors -> (how it is made, its class, what the LoadVoice message must say)
BAD_VOICE_FILES = {"bigvoice": (_big_voice, SIZE, r"bigvoice\.safetensors is [\d,]+ bytes; a voice file is at most"),
                   "lyingvoice": (_lying_voice, LYING, r"lyingvoice\.safetensors.*header declares"),
                   "dirvoice": (None, LYING, r"dirvoice\.safetensors.*directory"),
                   "fifovoice": (None, LYING, r"fifovoice\.safetensors.*FIFO")}


@pytest.fixture(scope="module")
def prepare_base():
    def prepare(base: Path) -> None:
        models = base / "models" / "qwen3_tts"
        good = models / CUSTOM
        for name, (damage, _) in BAD_FOLDERS.items():
            _linked_copy(good, models / name, real=("speech_tokenizer",))
            damage(models / name)
        _linked_copy(good, models / "fine-tuned")
        _with_field(models / "fine-tuned" / "config.json", ("talker_config", "spk_id", EXTRA_SPEAKER), 3000)
        for name, (damage, _) in LYING_FOLDERS.items():
            _linked_copy(good, models / name, real=("speech_tokenizer",))
            damage(models / name)
        for name, make in SPECIAL_VOICES.items():
            make(models / "voices" / f"{name}.safetensors")
        for name, (make, _, _) in BAD_VOICE_FILES.items():
            if make is not None:
                make(models / "voices" / f"{name}.safetensors")
    return prepare


# -- prompts (API format) ------------------------------------------------------------------------------------

def _loader(ckpt=CUSTOM, **kw):
    return {"class_type": P + "LoadQwen3TTS",
            "inputs": {"checkpoint": ckpt, "dtype": "auto", "cuda_graphs": "auto", "triton": "auto", "max_takes": 1,
                       **kw}}


def _custom(loader=None, **kw):
    return {"1": loader or _loader(),
            "2": {"class_type": P + "CustomVoice",
                  "inputs": {"model": ["1", 0], "text": "Classes over HTTP.", "speaker": "Ryan", "language": "English",
                             "seed": 1, "takes": 1, "max_new_tokens": 2, **kw}},
            "3": {"class_type": "PreviewAudio", "inputs": {"audio": ["2", 0]}}}


def _voice_source(ref_text="Some reference words."):
    """Base loader -> LoadAudio -> ExtractSpeakerEmbedding (node 3); the same inputs every time, so ComfyUI's cache
    runs them once."""
    return {"1": _loader(BASE),
            "2": {"class_type": "LoadAudio", "inputs": {"audio": "qwen3tts_reference.ogg"}},
            "3": {"class_type": P + "ExtractSpeakerEmbedding",
                  "inputs": {"model": ["1", 0], "audio": ["2", 0], "batch_index": 0, "ref_text": ref_text}}}


def _save_voice(name, overwrite=True, linked=False, voice=("3", 0), **source):
    p = _voice_source(**source)
    p["4"] = {"class_type": P + "SaveVoice", "inputs": {"voice": list(voice), "name": name, "overwrite": overwrite}}
    if linked:  # a linked name skips validate_inputs: execute must check it itself
        p["9"] = {"class_type": "PrimitiveString", "inputs": {"value": name}}
        p["4"]["inputs"]["name"] = ["9", 0]
    return p


def _blend(w1, w2):
    p = _save_voice("blended", voice=("5", 0))
    p["5"] = {"class_type": P + "BlendVoices",
              "inputs": {"voice_1": ["3", 0], "voice_2": ["3", 0], "weight_1": w1, "weight_2": w2}}
    return p


def _script(script="Alice: Hi.\nAlice: Bye.", line_gap=0.3, **kw):
    return {"1": _loader(),
            "2": {"class_type": P + "Script",
                  "inputs": {"model": ["1", 0], "script": script, "voices": "Alice = Ryan", "language": "English",
                             "seed": 0, "line_gap": line_gap, "names_in_subtitles": True, "max_new_tokens": 2, **kw}},
            "3": {"class_type": "PreviewAudio", "inputs": {"audio": ["2", 0]}}}


def _subtitles(prefix, text=SRT):
    return {"1": {"class_type": "PrimitiveString", "inputs": {"value": text}},
            "2": {"class_type": P + "SaveSubtitles", "inputs": {"subtitles": ["1", 0], "filename_prefix": prefix}}}


# -- outcomes --------------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    kind: str  # "refused" (HTTP 400), "error" (execution error) or "success"
    node: str | None = None  # the node that failed
    text: str = ""  # refused: the node's errors (the pack's own message where it gave one); error: the message
    error_type: str = ""
    entry: dict | None = None


def _outcome(c, prompt) -> Outcome:
    status, body = c.queue(prompt)
    if status == 400:
        nodes = body.get("node_errors") or {}
        node = next(iter(nodes), None)
        lines = []
        for e in nodes.get(node, {}).get("errors", []):
            if e["type"] == "custom_validation_failed":  # details: "<each validated input> - <the node's message>"
                lines.append(e["details"].split(" - ", 1)[-1])
            else:
                lines.append(f"{e['extra_info'].get('input_name')}: {e['message']}: {e['details']}")
        return Outcome("refused", node, "\n".join(dict.fromkeys(lines)) or json.dumps(body))
    assert status == 200, body
    entry = c.wait(body["prompt_id"], timeout=60)
    for kind, data in entry["status"]["messages"]:
        if kind == "execution_error":
            return Outcome("error", str(data["node_id"]), data["exception_message"],
                           data["exception_type"].rsplit(".", 1)[-1], entry)
    assert entry["status"]["status_str"] == "success", entry["status"]
    return Outcome("success", entry=entry)


def _alive(c) -> None:
    assert c.proc.poll() is None, f"ComfyUI exited; see {c.base / 'comfyui.log'}"
    c.get("/system_stats")


COUNTS: Counter = Counter()  # (class, "refused" | "error" | "ran") -> cases
UNCLEAR: list = []


def _refused(c, cls: str, case: str, prompt: dict, node: str, node_type: str, words: str) -> Outcome:
    """The prompt is refused at node `node` (a 400 naming the input, or an execution error of that node starting with
    its name), with a message matching `words`; the server answers afterwards."""
    out = _outcome(c, prompt)
    _alive(c)
    COUNTS[(cls, out.kind)] += 1
    ok = out.kind in ("refused", "error") and out.node == node and re.search(words, out.text, re.IGNORECASE | re.DOTALL)
    if out.kind == "error":
        ok = ok and out.text.startswith(f"{node_type}: ") and out.error_type in TYPED
    if not ok:
        UNCLEAR.append((cls, case, out.kind, out.node, out.error_type, out.text[:400]))
    return out


def _clear(start: int) -> None:
    """No case since UNCLEAR[start] ended unclear."""
    assert UNCLEAR[start:] == [], "\n".join(map(str, UNCLEAR[start:]))


# -- 1 checkpoint configs ------------------------------------------------------------------------------------

def _pack_node_ids() -> set:
    """Every node id the pack defines, read from its sources (node_id=PREFIX + "...")."""
    ids = set()
    for f in (PACK / "nodes").glob("node_*.py"):
        ids.update(P + m for m in re.findall(r'node_id=PREFIX \+ "(\w+)"', f.read_text()))
    return ids


def test_bad_checkpoint_folders_never_affect_the_others(server):
    start = len(UNCLEAR)
    info, ids = server.get("/object_info"), _pack_node_ids()
    assert len(ids) >= 10 and ids <= set(info), sorted(ids - set(info))
    speakers = info[P + "CustomVoice"]["input"]["required"]["speaker"]
    options = speakers[1]["options"] if isinstance(speakers[1], dict) and "options" in speakers[1] else speakers[0]
    assert {"Vivian", "Serena", "Uncle_Fu", "Dylan", "Eric", "Ryan", "Aiden", "Ono_Anna", "Sohee",
            EXTRA_SPEAKER} <= set(options), options
    assert "bad_speaker" not in options
    loader = info[P + "LoadQwen3TTS"]["input"]["required"]["checkpoint"]
    listed = loader[1]["options"] if isinstance(loader[1], dict) and "options" in loader[1] else loader[0]
    assert set(BAD_FOLDERS) | set(LYING_FOLDERS) | {CUSTOM, "fine-tuned"} <= set(listed), listed
    assert not [n for n in listed if "/" in n], "a checkpoint's own sub-folder is listed as a checkpoint"
    for name, (_, words) in BAD_FOLDERS.items():
        _refused(server, CONFIGS, name, _custom(_loader(name)), "1", "LoadQwen3TTS", words)
    assert _outcome(server, _custom(speaker=EXTRA_SPEAKER, loader=_loader("fine-tuned"))).kind == "success"
    COUNTS[(CONFIGS, "ran")] += 1
    _clear(start)


# -- 2 output paths, 3 silent overwrites ---------------------------------------------------------------------

def _voices(c) -> Path:
    return c.base / "models" / "qwen3_tts" / "voices"


def test_save_voice_output_paths_are_refused(server):
    start = len(UNCLEAR)
    voices = _voices(server)
    for name in SPECIAL_VOICES:
        _refused(server, OUTPUT, name, _save_voice(name), "4", "SaveVoice",
                 rf"{name}\.safetensors is (a directory|not a regular file \(it is a FIFO).*never replaced; "
                 r"choose another name")
    for linked in (False, True):
        _refused(server, OUTPUT, f"300 characters, linked {linked}", _save_voice("v" * 300, linked=linked), "4",
                 "SaveVoice", r"voice name.*at most 100 characters")
        _refused(server, OUTPUT, f"a NUL byte, linked {linked}", _save_voice("\x00", linked=linked), "4",
                 "SaveVoice", r"voice name is empty.*type a name")
    assert sorted(p.name for p in voices.iterdir()) == sorted(f"{n}.safetensors" for n in BAD_VOICE_FILES)
    _clear(start)


def test_save_subtitles_output_paths_are_refused(server):
    start = len(UNCLEAR)
    _refused(server, OUTPUT, "prefix too long", _subtitles("s" * 300), "2", "SaveSubtitles",
             r"filename_prefix.*(too long|name)")
    _clear(start)


def test_names_that_differ_only_by_blanks_or_controls_never_replace_a_voice(server):
    start = len(UNCLEAR)
    keep = _voices(server) / "keep.safetensors"
    assert _outcome(server, _save_voice("keep")).kind == "success"
    before = keep.read_bytes(), keep.stat().st_mtime_ns
    for name in (" keep", "keep ", "keep\t", "keep\n", "ke\u200bep", "keep\x00", "\x1bkeep"):
        _refused(server, OVERWRITE, repr(name), _save_voice(name), "4", "SaveVoice",
                 r"saved as 'keep'.*a voice named 'keep' exists.*type 'keep' exactly")
    _refused(server, OVERWRITE, "same name, overwrite off", _save_voice("keep", overwrite=False), "4", "SaveVoice",
             r"'keep' exists.*enable overwrite or choose another name")
    assert (keep.read_bytes(), keep.stat().st_mtime_ns) == before
    assert not [p for p in _voices(server).iterdir() if p.name.endswith(".tmp")]
    _clear(start)


@pytest.mark.parametrize("prefix", ["", "qwen3tts/"], ids=["empty", "a folder"])
def test_save_subtitles_writes_a_new_file_every_run(server, prefix):
    written = []
    for run in range(2):
        text = SRT + f"run {run} of {prefix!r}\n"
        out = _outcome(server, _subtitles(prefix, text))
        assert out.kind == "success", out.text
        item = out.entry["outputs"]["2"]["subtitles"][0]
        path = server.base / "output" / item["subfolder"] / item["filename"]
        assert path.read_text() == text
        written.append(path)
        COUNTS[(OVERWRITE, "ran")] += 1
    assert written[0] != written[1] and written[0].read_text() != written[1].read_text()
    assert re.fullmatch(r"subtitles_\d{5}_\.srt", written[0].name), written[0].name


# -- 5 script totals, 6 widget ranges ------------------------------------------------------------------------

def test_script_totals_and_widget_ranges(server):
    start = len(UNCLEAR)
    _refused(server, RANGES, "line_gap NaN", _script(line_gap=math.nan), "2", "Script", r"line_gap must be .*number")
    _refused(server, TOTALS, "pauses past the total", _script("\n".join(["Alice: Hi.", "[pause 600s]"] * 2 +
                                                                         ["Alice: Bye.", "[pause 1s]"])),
             "2", "Script", r"pause.*at most 20 minutes")
    _refused(server, TOTALS, "line gaps past the total", _script("\n".join(["Alice: Hi."] * 200), line_gap=10.0),
             "2", "Script", r"line_gap.*at most 20 minutes")
    _refused(server, RANGES, "line_gap past its max", _script(line_gap=10.01), "2", "Script", r"line_gap.*max")
    _refused(server, RANGES, "top_p past its max", _custom(top_p=1.01), "2", "CustomVoice", r"top_p.*max")
    _refused(server, RANGES, "max_new_tokens past its max", _custom(max_new_tokens=8193), "2", "CustomVoice",
             r"max_new_tokens.*max")
    _refused(server, RANGES, "temperature 0", _custom(temperature=0.0), "2", "CustomVoice",
             r"temperature must be in \(0.*greedy")
    assert _outcome(server, _custom(max_new_tokens=1)).kind == "success"
    COUNTS[(RANGES, "ran")] += 1
    _clear(start)


# -- 7 degenerate numbers ------------------------------------------------------------------------------------

def test_vanishing_blend_weights_and_invisible_reference_text(server):
    start = len(UNCLEAR)
    for w1, w2 in ((0.0, 0.0), (1e-30, 1e-30), (math.nan, 1.0)):
        _refused(server, NUMBERS, f"weights {w1}, {w2}", _blend(w1, w2), "5", "BlendVoices",
                 r"(weights add up to .*Raise a weight|weight_1 must be a finite number in \[0, 100\])")
    for text in ("\u200b\u200b", "\u200e\ufeff", " \u2060 \u00ad"):
        _refused(server, NUMBERS, f"ref_text {text!r}", _save_voice("invisible", ref_text=text), "3",
                 "ExtractSpeakerEmbedding", r"ref_text is empty.*invisible.*x-vector")
    assert not (_voices(server) / "blended.safetensors").exists()
    assert not (_voices(server) / "invisible.safetensors").exists()
    _clear(start)


# -- 9 load arguments ----------------------------------------------------------------------------------------

LOAD_CASES = [  # (case, loader inputs, the input the refusal must name)
    ("max_takes 0", {"max_takes": 0}, "max_takes"),
    ("max_takes 17", {"max_takes": 17}, "max_takes"),
    ("max_takes text", {"max_takes": "four"}, "max_takes"),
    ("max_takes NaN", {"max_takes": math.nan}, "max_takes"),
    ("dtype int8", {"dtype": "int8"}, "dtype"),
    ("cuda_graphs yes", {"cuda_graphs": "yes"}, "cuda_graphs"),
    ("triton a number", {"triton": 1}, "triton"),
    ("codec unknown", {"codec": "no-such-codec"}, "codec"),
    ("download unknown", {"download": "Qwen/not-a-repo"}, "download"),
    ("checkpoint with a NUL", {"checkpoint": CUSTOM + "\x00"}, "checkpoint"),
]


@pytest.mark.parametrize("case, inputs, name", LOAD_CASES, ids=[c for c, _, _ in LOAD_CASES])
def test_bad_load_arguments(server, case, inputs, name):
    start = len(UNCLEAR)
    _refused(server, LOAD, case, _custom(_loader(**inputs)), "1", "LoadQwen3TTS", re.escape(name))
    _clear(start)


# -- the server after every case ------------------------------------------------------------------------------

# -- 4 size before work, 8 lying files ----------------------------------------------------------------------

def _load_voice(name, listed: str):
    """Base loader -> LoadVoice (its name linked, so a file the list leaves out is still asked for; `listed` is any
    name of the list, which validation wants in voice_name) -> VoiceClone."""
    return {"1": _loader(BASE),
            "5": {"class_type": "PrimitiveString", "inputs": {"value": name}},
            "4": {"class_type": P + "LoadVoice", "inputs": {"model": ["1", 0], "voice_name": listed,
                                                            "name_override": ["5", 0]}},
            "6": {"class_type": P + "VoiceClone",
                  "inputs": {"model": ["1", 0], "voice": ["4", 0], "text": "Cloned.", "language": "English",
                             "seed": 1, "takes": 1}},
            "7": {"class_type": "PreviewAudio", "inputs": {"audio": ["6", 0]}}}


def test_huge_lying_and_special_files_are_refused_before_reading(server):
    start = len(UNCLEAR)
    names = server.get("/object_info")[P + "LoadVoice"]["input"]["required"]["voice_name"]
    listed = (names[1]["options"] if isinstance(names[1], dict) and "options" in names[1] else names[0])[0]
    for name, (_, cls, words) in BAD_VOICE_FILES.items():
        _refused(server, cls, name, _load_voice(name, listed), "4", "LoadVoice", words)
    for name, (_, words) in LYING_FOLDERS.items():
        _refused(server, LYING, name, _custom(_loader(name)), "1", "LoadQwen3TTS", words)
    _clear(start)


def test_zz_server_runs_normally_and_the_counts(server, figure):
    """Run last (pytest keeps file order): a normal run after every case, and the figures."""
    t0 = time.time()
    assert _outcome(server, _custom()).kind == "success"
    by_class: dict = {}
    for (cls, kind), n in sorted(COUNTS.items()):
        by_class.setdefault(cls, {})[kind] = n
    figure(surface="nodes over HTTP", cases=sum(COUNTS.values()), by_class=by_class, unclear=len(UNCLEAR),
           normal_run_s=round(time.time() - t0, 2))
    assert COUNTS, "run with the other tests of this file"
    assert UNCLEAR == [], "\n".join(map(str, UNCLEAR))
