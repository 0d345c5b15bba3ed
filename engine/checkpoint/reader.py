"""Read a checkpoint directory with typed errors: missing files, missing keys, wrong shapes, damaged files.

Weights are streamed: the file's bytes are read in large pieces by a few threads into two host staging
buffers (pinned for a CUDA target, so each copy to the device runs while the next piece is read) and land in
the tensors the module will keep; a tensor stored in another dtype or layout lands in a temporary and is cast
on the target device. Loading a model costs one read of its weights and about one copy of them in the target
dtype. (Per tensor through safetensors' memory map, the page faults and the pageable copies would run one
after another.)
"""
from __future__ import annotations

import json
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

from .. import files
from ..errors import CheckpointError
from . import codec_source

MAIN_FILES = (
    "config.json", "generation_config.json", "model.safetensors",
    "vocab.json", "merges.txt", "tokenizer_config.json", "preprocessor_config.json",
)
CODEC_FILES = tuple(f"{codec_source.CODEC_SUBDIR}/{f}" for f in codec_source.CODEC_FILES)
REQUIRED_FILES = MAIN_FILES + CODEC_FILES  # a complete checkpoint as published

_LAYOUT = (
    "A Qwen3-TTS-12Hz checkpoint directory holds config.json, generation_config.json, model.safetensors, "
    "vocab.json, merges.txt, tokenizer_config.json and preprocessor_config.json, plus a speech_tokenizer/ "
    "subfolder with config.json, model.safetensors and preprocessor_config.json (the codec, "
    "Qwen3-TTS-Tokenizer-12Hz). Download the whole model repository into one folder."
)


def check_layout(model_dir: str | Path, own_codec: bool = True) -> Path:
    """Raise CheckpointError naming the first missing file; return the directory as a Path.

    The codec files are checked where speech_tokenizer/ exists and own_codec is True; a folder without it
    may borrow another checkpoint's codec (checkpoint/codec_source.py)."""
    d = Path(model_dir)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory {d} does not exist or is not a folder. {_LAYOUT}")
    wanted = MAIN_FILES + (CODEC_FILES if own_codec and (d / "speech_tokenizer").is_dir() else ())
    missing = [rel for rel in wanted if not (d / rel).is_file()]
    odd = next((rel for rel in missing if (d / rel).exists()), None)
    if odd is not None:  # there, but a directory, FIFO or device: say so, never read it
        raise CheckpointError(f"checkpoint {d}: {d / odd} is {files.kind((d / odd).stat().st_mode)}, not a file. "
                              f"{_LAYOUT}")
    if missing:
        codec_only = all(m.startswith("speech_tokenizer/") for m in missing)
        hint = (" The codec files go into the speech_tokenizer/ subfolder of the model directory (the published "
                "model repositories ship it there); delete an incomplete speech_tokenizer/ to use the codec "
                "of another installed checkpoint instead." if codec_only else "")
        raise CheckpointError(
            f"checkpoint {d} is incomplete: missing {d / missing[0]}"
            + (f" (and {len(missing) - 1} more: {', '.join(missing[1:])})" if len(missing) > 1 else "")
            + f".{hint} {_LAYOUT}")
    return d


def _damage_errors() -> tuple[type[BaseException], ...]:
    import safetensors

    return (safetensors.SafetensorError, OSError, ValueError, RuntimeError, EOFError)


def _open(path: Path):
    from safetensors import safe_open

    if not path.is_file():
        raise CheckpointError(f"missing weights file {path}. {_LAYOUT}")
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except _damage_errors() as exc:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({type(exc).__name__}: {exc}); it is probably truncated "
            "or corrupted (an interrupted download?). Delete it and download it again."
        ) from exc


def _owner(module: nn.Module, local: str) -> tuple[nn.Module, str]:
    if "." not in local:
        return module, local
    path, attr = local.rsplit(".", 1)
    return module.get_submodule(path), attr


@torch.no_grad()
def load_state_dict_into(module: nn.Module, safetensors_path: str | Path, prefix: str = "",
                         dtype: torch.dtype | None = None, device: str | torch.device | None = None) -> nn.Module:
    """Load the `prefix`-keyed tensors of a safetensors file into `module` (its names without the prefix).

    Floating tensors are cast to `dtype` (None keeps the file's dtype); integer tensors keep theirs. Each
    tensor replaces the module's own (which may be on the meta device) on `device`, in the module's own strides
    (the codec decoder stores its conv weights channels fastest). Raises CheckpointError
    naming the file and the key for a missing key, a shape mismatch (expected vs found), an unexpected key
    under `prefix` or a damaged file.
    """
    path = Path(safetensors_path)
    target = module.state_dict(keep_vars=True)
    if device is None:
        device = next((t.device for t in target.values() if not t.is_meta), torch.device("cpu"))
    device = torch.device(device)
    f = _open(path)
    try:
        with f:
            keys = set(f.keys())
            for local, current in target.items():
                key = prefix + local
                if key not in keys:
                    raise CheckpointError(
                        f"{path} has no tensor '{key}'; the file does not belong to this model (wrong size, type "
                        "or a different model). Use the model.safetensors of the same checkpoint as config.json.")
                found = tuple(f.get_slice(key).get_shape())
                if found != tuple(current.shape):
                    raise CheckpointError(
                        f"{path}: tensor '{key}' has shape {list(found)} but the model built from config.json "
                        f"expects {list(current.shape)}; config.json and the weights come from different "
                        "checkpoints. Keep each checkpoint's files together.")
            extra = sorted(k for k in keys if k.startswith(prefix) and k[len(prefix):] not in target)
            if extra:
                raise CheckpointError(
                    f"{path} has unexpected tensor '{extra[0]}'"
                    + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
                    + f" under '{prefix}'; the file belongs to a different model version or type.")
        groups = [[prefix + (name + "." if name else "") + key for key in group]
                  for name, sub in module.named_modules() for group in getattr(sub, "MERGED_ROWS", ())]
        loaded = _stream(path, {prefix + local: current for local, current in target.items()}, dtype, device, groups)
        for local, current in target.items():
            t = loaded.pop(prefix + local)
            owner, attr = _owner(module, local)
            if attr in owner._parameters:
                owner._parameters[attr] = nn.Parameter(t, requires_grad=current.requires_grad)
            else:
                owner._buffers[attr] = t
    except (CheckpointError, torch.cuda.OutOfMemoryError):  # out of memory is not a damaged file: say it as is
        raise
    except _damage_errors() as exc:  # a damaged header or an unreadable file
        raise CheckpointError(
            f"{path} could not be read ({type(exc).__name__}: {exc}); it is probably truncated or corrupted. "
            "Delete it and download it again.") from exc
    return module


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}
PIECE_BYTES = 64 << 20  # one staging buffer; two of them alternate
READ_THREADS = 4  # readers of one piece (each read releases the GIL)


def _header(path: Path) -> tuple[int, dict]:
    """(where the data starts, {key: entry}) from a safetensors header: an 8-byte little-endian length, then
    that many bytes of JSON with each tensor's dtype, shape and [begin, end) byte offsets into the data."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > size - 8:  # never read (or allocate) what the file cannot hold
            raise CheckpointError(f"{path}: its header declares {n:,} bytes but the file holds {size - 8:,} after "
                                  "it; the file is truncated or corrupted. Delete it and download it again.")
        entries = json.loads(fh.read(n))
    entries.pop("__metadata__", None)
    return 8 + n, entries


def _stream(path: Path, want: dict, dtype: torch.dtype | None, device: torch.device, groups=()) -> dict:
    """{key: tensor on `device`} for each key of `want` (key -> the module's tensor, which gives the shape and
    strides to keep), floating tensors cast to `dtype` (None keeps the file's). Each of `groups` (lists of
    keys) that can be is laid out as consecutive rows of one tensor (_merged_rows). Keys and shapes are
    checked by the caller."""
    start, entries = _header(path)

    def dtypes(key):  # (in the file, in memory)
        stored = _ST_DTYPES.get(entries[key]["dtype"])
        if stored is None:
            raise CheckpointError(f"{path}: tensor '{key}' has dtype {entries[key]['dtype']}, which this loader "
                                  "does not read.")
        return stored, dtype if stored.is_floating_point and dtype is not None else stored

    merged = {}
    for group in groups:
        merged.update(_merged_rows([(key, want.get(key), dtypes(key)[1] if key in want else None)
                                    for key in group], device))
    jobs = []
    for key, current in want.items():
        e = entries[key]
        stored, final_dtype = dtypes(key)
        if key in merged:
            final = merged[key]
        elif current.dim() > 1:
            final = torch.empty_strided(current.shape, current.stride(), dtype=final_dtype, device=device)
        else:
            final = torch.empty(current.shape, dtype=final_dtype, device=device)
        job = _Job(key, start + e["data_offsets"][0], e["data_offsets"][1] - e["data_offsets"][0], final, stored)
        if job.size != final.numel() * stored.itemsize:
            raise CheckpointError(f"{path}: tensor '{key}' has {job.size} bytes for shape {e['shape']} "
                                  f"{e['dtype']}; the file is corrupted. Delete it and download it again.")
        jobs.append(job)
    _copy_pieces(path, sorted(jobs, key=lambda j: j.offset), device)
    return {job.key: job.final for job in jobs}


def _merged_rows(group: list, device: torch.device) -> dict:
    """{key: its rows of one new tensor} for a group of (key, module tensor, dtype) whose tensors are all
    present, 2-D and row-major, with one width and one dtype; {} otherwise (each then gets its own)."""
    if any(cur is None or cur.dim() != 2 or not cur.is_contiguous() for _, cur, _ in group):
        return {}
    if len({cur.shape[1] for _, cur, _ in group}) != 1 or len({dt for _, _, dt in group}) != 1:
        return {}
    whole = torch.empty(sum(cur.shape[0] for _, cur, _ in group), group[0][1].shape[1], dtype=group[0][2],
                        device=device)
    out, row = {}, 0
    for key, cur, _ in group:
        out[key] = whole[row: row + cur.shape[0]]
        row += cur.shape[0]
    return out


class _Job:
    """One tensor's bytes: where they are in the file, and the tensor they end in. They land in `final`
    itself when it has the file's dtype and is contiguous, else in a temporary made when the first bytes
    arrive and cast into `final` (on the device, in stream order) when the last have been queued."""

    def __init__(self, key, offset, size, final, stored):
        self.key, self.offset, self.size, self.final, self.stored = key, offset, size, final, stored
        self.landing = None

    def dest(self) -> torch.Tensor:
        if self.landing is None:
            direct = self.final.dtype == self.stored and self.final.is_contiguous()
            self.landing = self.final if direct else torch.empty(self.final.shape, dtype=self.stored,
                                                                 device=self.final.device)
        return self.landing.view(-1).view(torch.uint8)

    def finish(self) -> None:
        if self.landing is not self.final:
            self.final.copy_(self.landing)
        self.landing = None


def _copy_pieces(path: Path, jobs: list, device: torch.device) -> None:
    """Copy each job's file bytes into its tensor: the file is read in pieces of up to PIECE_BYTES
    (neighbouring tensors share a piece, a large one spans several) into two alternating host buffers;
    each piece's copies to the device are queued on the current stream, and its buffer is reused only once
    they are done."""
    pieces = _plan(jobs)
    if not pieces:
        return
    cuda = device.type == "cuda"
    size = max(p[1] for p in pieces)
    bufs = [torch.empty(size, dtype=torch.uint8, pin_memory=cuda) for _ in range(min(2, len(pieces)))]
    done = [None] * len(bufs)
    with ThreadPoolExecutor(READ_THREADS) as pool:
        for i, (offset, n, parts) in enumerate(pieces):
            slot = i % len(bufs)
            if done[slot] is not None:
                done[slot].synchronize()
            host = bufs[slot]
            _read(pool, host.numpy(), offset, n, path)
            for where, count, job, at in parts:
                job.dest()[at:at + count].copy_(host[where:where + count], non_blocking=cuda)
                if at + count == job.size:
                    job.finish()
            if cuda:  # on the target device's stream (the current device may be another GPU)
                done[slot] = torch.cuda.Event()
                done[slot].record(torch.cuda.current_stream(device))
    if cuda:
        torch.cuda.current_stream(device).synchronize()  # the staging buffers go back on return


def _plan(jobs: list) -> list:
    """Group jobs (sorted by offset) into pieces (offset, bytes, parts) of at most PIECE_BYTES, skipping gaps
    under 1 MB between neighbours; a part (where in the piece, bytes, job, where in the job's bytes) copies
    one tensor's bytes or a slice of a large one."""
    pieces, cur = [], None
    for job in jobs:
        done = 0
        while done < job.size:
            at = job.offset + done
            gap = None if cur is None else at - cur[0] - cur[1]
            if gap is not None and 0 <= gap < (1 << 20) and at - cur[0] < PIECE_BYTES:
                room = PIECE_BYTES - (at - cur[0])
            else:
                cur = [at, 0, []]
                pieces.append(cur)
                room = PIECE_BYTES
            n = min(job.size - done, room)
            cur[2].append((at - cur[0], n, job, done))
            cur[1] = at - cur[0] + n
            done += n
    return [tuple(p) for p in pieces]


def _read(pool, host, offset: int, size: int, path: Path) -> None:
    """Fill host[:size] from the file at `offset`, READ_THREADS slices at once (a file object each: no
    shared position, and Windows has no pread)."""
    step = -(-size // READ_THREADS)

    def one(a):
        view = memoryview(host)[a:min(a + step, size)]
        got = 0
        with open(path, "rb", buffering=0) as fh:
            fh.seek(offset + a)
            while got < len(view):
                n = fh.readinto(view[got:])
                if not n:
                    raise CheckpointError(f"{path} ends before its tensors do; it is probably truncated or "
                                          "corrupted (an interrupted download?). Delete it and download it again.")
                got += n

    list(pool.map(one, range(0, size, step)))
