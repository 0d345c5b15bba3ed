"""Mutants of a checkpoint's JSON configs, generated from the files themselves (not listed by hand).

Every field of a config (the JSON walked recursively: objects, lists and their items) gets:
  type swaps     a value of each other JSON type (string, whole number, real, boolean, null, list, object)
  out of range   negative, zero, huge (2^63), past any vocabulary (+3072), NaN and infinity for numbers; the
                 empty string for strings
  nesting        a list nested 64 deep (parses, reaches the field checks) and 100000 deep (the parser's limit)
  missing        the key (or list item) removed
`workspace()` gives one checkpoint folder whose files link to a real one, so each mutant costs one small write.
"""
from __future__ import annotations

import copy
import json
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SWAPS = {"string": "seven", "whole": 7, "real": 0.5, "bool": True, "null": None, "list": [7], "object": {"x": 7}}
PAST_VOCAB = 3072  # added to an id, it is past the talker's codec vocabulary and the tiny text vocabulary
SHALLOW, PARSER_LIMIT = 64, 100_000
_DEEP = "__deeply_nested__"
_REMOVED = object()


def json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "whole"
    if isinstance(value, float):
        return "real"
    if isinstance(value, str):
        return "string"
    return "list" if isinstance(value, list) else "object"


@dataclass(frozen=True)
class Mutant:
    file: str  # relative to the checkpoint folder
    path: tuple  # keys and list indices from the file's top object to the field
    kind: str  # "type:<json type>", "range:<what>", "nesting:<depth>" or "missing"
    value: object = None

    @property
    def field(self) -> str:
        return ".".join(str(p) for p in self.path)

    @property
    def group(self) -> str:
        """type | range | nesting | missing: what the docs count."""
        return self.kind.split(":")[0]

    def text(self, doc: dict) -> str:
        """The file's JSON with this mutation applied."""
        doc = copy.deepcopy(doc)
        *parents, last = self.path
        node = doc
        for p in parents:
            node = node[p]
        if self.kind == "missing":
            del node[last]
            return json.dumps(doc)
        deep = self.kind.startswith("nesting:")
        node[last] = _DEEP if deep else self.value
        out = json.dumps(doc)  # Python's writer: NaN and Infinity as bare words, as transformers writes them
        if deep:  # the writer itself refuses deep nesting, so the nest is spliced in as text
            depth = int(self.kind.split(":")[1])
            out = out.replace(json.dumps(_DEEP), "[" * depth + "7" + "]" * depth)
        return out


def fields(doc, path: tuple = ()) -> Iterator[tuple[tuple, object]]:
    """(path, value) of every field below `doc`, parents before their children."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield path + (key,), value
        yield from fields(value, path + (key,))


def mutants(file: str, doc: dict, under: tuple = ()) -> list[Mutant]:
    """Every mutant of every field of `doc` (only those below the path `under`, when given)."""
    out = []
    for path, value in fields(doc):
        if path[: len(under)] != under:
            continue
        kind = json_type(value)
        out += [Mutant(file, path, f"type:{name}", new) for name, new in SWAPS.items() if name != kind]
        if kind in ("whole", "real"):
            out += [Mutant(file, path, "range:negative", -abs(value) - 1), Mutant(file, path, "range:zero", 0),
                    Mutant(file, path, "range:huge", 1 << 63), Mutant(file, path, "range:nan", math.nan),
                    Mutant(file, path, "range:infinity", math.inf)]
            if kind == "whole":
                out.append(Mutant(file, path, "range:past_vocab", value + PAST_VOCAB))
        if kind == "string":
            out.append(Mutant(file, path, "range:empty", ""))
        out += [Mutant(file, path, f"nesting:{SHALLOW}"), Mutant(file, path, f"nesting:{PARSER_LIMIT}"),
                Mutant(file, path, "missing")]
    return out


class Workspace:
    """A checkpoint folder whose files are links to `source`'s, except the one being mutated."""

    def __init__(self, source: Path, root: Path, name: str | None = None):
        self.source = Path(source)
        self.dir = Path(root) / (name or self.source.name)
        self.dir.mkdir(parents=True)
        for entry in self.source.iterdir():
            if entry.is_dir():  # speech_tokenizer/: a real folder, its files linked
                (self.dir / entry.name).mkdir()
                for f in entry.iterdir():
                    os.symlink(f, self.dir / entry.name / f.name)
            else:
                os.symlink(entry, self.dir / entry.name)

    def original(self, file: str) -> dict:
        return json.loads((self.source / file).read_text(encoding="utf-8"))

    def write(self, file: str, text: str) -> None:
        target = self.dir / file
        target.unlink()
        target.write_text(text, encoding="utf-8")

    def restore(self, file: str) -> None:
        target = self.dir / file
        target.unlink()
        os.symlink(self.source / file, target)

    def remove(self) -> None:
        shutil.rmtree(self.dir)
