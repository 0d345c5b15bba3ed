"""Hostile paths and files for the robustness suite: special files where a regular file is expected, names no
file system can hold, sparse files of gigabytes that take no disk, and WAV files whose header lies.

Every maker takes a folder and returns the path it made (or skips the test where the OS cannot make it).
"""
from __future__ import annotations

import builtins
import os
import stat
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

GB = 1 << 30


def fifo(folder: Path, name: str) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("this OS has no FIFOs (os.mkfifo)")
    path = folder / name
    os.mkfifo(path)
    return path


def device(folder: Path, name: str) -> Path:
    """A link to /dev/zero: a character device that never ends when read (and swallows what is written)."""
    if not os.path.exists("/dev/zero") or not stat.S_ISCHR(os.stat("/dev/zero").st_mode):
        pytest.skip("no /dev/zero character device")
    path = folder / name
    os.symlink("/dev/zero", path)
    return path


def directory(folder: Path, name: str) -> Path:
    path = folder / name
    path.mkdir()
    return path


def link_to_fifo(folder: Path, name: str) -> Path:
    target = fifo(folder, f"target_of_{name}")
    path = folder / name
    os.symlink(target, path)
    return path


def link_to_directory(folder: Path, name: str) -> Path:
    target = directory(folder, f"target_of_{name}")
    path = folder / name
    os.symlink(target, path)
    return path


def dangling_link(folder: Path, name: str) -> Path:
    path = folder / name
    os.symlink(folder / f"missing_{name}", path)
    return path


# what each is called in the errors: the words a user reads
SPECIALS = {
    "directory": (directory, "is a directory"),
    "FIFO": (fifo, r"not a regular file \(it is a FIFO"),
    "device": (device, r"not a regular file \(it is a character device"),
    "link to a FIFO": (link_to_fifo, r"not a regular file \(it is a FIFO"),
    "link to a directory": (link_to_directory, "is a directory"),
}


def long_name(folder: Path, suffix: str) -> Path:
    return folder / ("n" * 300 + suffix)


def nul_name(folder: Path, suffix: str) -> Path:
    return folder / f"bad\0name{suffix}"


BAD_NAMES = {"too long": (long_name, r"bytes long, but file systems allow at most 255"),
             "NUL byte": (nul_name, "contains a NUL byte")}


def fingerprint(path: Path):
    """What sits at `path` (not following a link) and, for a link, what sits at its target: unchanged after a
    refused write."""
    st = os.lstat(path)
    kind = stat.S_IFMT(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        return kind, target, stat.S_IFMT(os.stat(path).st_mode) if os.path.exists(path) else None
    return kind, st.st_ino


def within(seconds: float, fn, *args, **kwargs):
    """fn(*args, **kwargs) in a thread that must finish within `seconds` (a read of a FIFO or /dev/zero would hang the
    test run); returns its result or re-raises its exception."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} still runs after {seconds} s: it blocks on the file"
    if "error" in out:
        raise out["error"]
    return out["value"]


class ReadCounter:
    """Counts the bytes Python code reads from files opened through `open` of the given modules."""

    def __init__(self, monkeypatch, *modules):
        self.bytes = 0
        counter = self

        class Counted:
            def __init__(self, fh):
                self._fh = fh

            def read(self, n=-1):
                data = self._fh.read(n)
                counter.bytes += len(data)
                return data

            def __getattr__(self, name):
                return getattr(self._fh, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self._fh.close()

        def counted_open(*args, **kwargs):
            return Counted(builtins.open(*args, **kwargs))

        for module in modules:
            monkeypatch.setattr(module, "open", counted_open, raising=False)


# ---------------------------------------------------------------------------------------------------------
# WAV files, honest and lying

def fmt_chunk(tag=1, channels=1, rate=24000, bits=16, align=None, byte_rate=None) -> bytes:
    align = channels * ((bits + 7) // 8) if align is None else align
    byte_rate = rate * align if byte_rate is None else byte_rate
    return struct.pack("<HHIIHH", tag, channels, rate, byte_rate % (1 << 32), align, bits)


def riff(chunks, riff_size=None, magic=b"RIFF") -> bytes:
    """A RIFF/WAVE file from (id, payload[, declared size]) chunks; odd payloads get their pad byte."""
    body = b"WAVE"
    for chunk in chunks:
        cid, payload = chunk[0], chunk[1]
        size = chunk[2] if len(chunk) > 2 else len(payload)
        body += cid + struct.pack("<I", size) + payload + (b"\0" if len(payload) % 2 else b"")
    return magic + struct.pack("<I", len(body) if riff_size is None else riff_size) + body


def tone_pcm16(seconds=1.5, rate=24000, channels=1) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    return np.repeat(x[:, None], channels, axis=1).tobytes()


def good_wav(seconds=1.5, rate=24000, channels=1) -> bytes:
    return riff([(b"fmt ", fmt_chunk(channels=channels, rate=rate)), (b"data", tone_pcm16(seconds, rate, channels))])


def sparse_wav(path: Path, total_bytes: int, data_size=None, channels=1, rate=24000, bits=16) -> Path:
    """A WAV header followed by a hole: a file of `total_bytes` that takes no disk. data_size None declares
    the rest of the file honestly."""
    head = riff([(b"fmt ", fmt_chunk(channels=channels, rate=rate, bits=bits))])
    align = channels * ((bits + 7) // 8)
    rest = total_bytes - len(head) - 8
    declared = rest - rest % align if data_size is None else data_size
    with open(path, "wb") as f:
        f.write(head + b"data" + struct.pack("<I", declared))
        f.truncate(total_bytes)
    return path


# Headers that contradict themselves or the file: (name, bytes, words of the error)
_BODY = tone_pcm16(1.5)
LYING_WAVS = {
    "block align larger than channels x bits": (riff([(b"fmt ", fmt_chunk(align=4)), (b"data", _BODY)]),
                                                r"frames of 4 bytes"),
    "block align smaller than channels x bits": (riff([(b"fmt ", fmt_chunk(channels=2, align=2)), (b"data", _BODY)]),
                                                 r"take 4 bytes a frame, but frames of 2"),
    "block align 0": (riff([(b"fmt ", fmt_chunk(align=0)), (b"data", _BODY)]), r"frames of 0 bytes"),
    "sample rate 0": (riff([(b"fmt ", fmt_chunk(rate=0)), (b"data", _BODY)]), r"at 0 Hz"),
    "0 channels": (riff([(b"fmt ", fmt_chunk(channels=0, align=2)), (b"data", _BODY)]), r"0 channels"),
    "0-bit samples": (riff([(b"fmt ", fmt_chunk(bits=0, align=2)), (b"data", _BODY)]), r"0-bit samples"),
    "data size past the end of the file": (riff([(b"fmt ", fmt_chunk()), (b"data", _BODY, len(_BODY) + 4000)]),
                                           r"'data' chunk declares .* bytes but the file ends"),
    "data size of 2 GB in a small file": (riff([(b"fmt ", fmt_chunk()), (b"data", _BODY, 2 * GB)]),
                                          r"'data' chunk declares 2,147,483,648 bytes"),
    "odd data size (half a frame)": (riff([(b"fmt ", fmt_chunk()), (b"data", _BODY[:-1])]),
                                     r"not a whole number of 2-byte frames"),
    "fmt size past the end of the file": (riff([(b"fmt ", fmt_chunk(), 1 << 20)]), r"'fmt ' chunk declares"),
    "fmt chunk of 1 MB": (riff([(b"fmt ", fmt_chunk() + b"\0" * (1 << 20)), (b"data", _BODY)]),
                          r"'fmt ' chunk declares 1,048,592 bytes"),
    "fmt chunk cut to 12 bytes": (riff([(b"fmt ", fmt_chunk()[:12]), (b"data", _BODY)]), r"truncated 'fmt '"),
    "a chunk before the audio that runs past the end": (riff([(b"fmt ", fmt_chunk()), (b"LIST", b"abcd", 1 << 30),
                                                              (b"data", _BODY)]), r"'LIST' chunk declares"),
    "no data chunk": (riff([(b"fmt ", fmt_chunk())]), r"missing the 'fmt ' or 'data' chunk"),
    "5000 empty chunks before the audio": (riff([(b"fmt ", fmt_chunk())] + [(b"junk", b"")] * 5000 + [(b"data", _BODY)]),
                               r"more than 1024 chunks"),
    "not RIFF": (b"RIFX" + good_wav()[4:], r"not a WAV file"),
}
