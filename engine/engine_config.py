"""EngineConfig: everything a load decides, frozen, so one value is both the load's argument and a cache key."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from . import checks
from .errors import CheckpointError, InvalidInputError, UnsupportedConfigError
from .limits import MAX_ROWS, MAX_TAKES

SWITCHES = ("auto", "on", "off")
DTYPE_NAMES = ("auto", "fp32", "bf16", "fp16")
# A cache shorter than a short prompt plus a few frames can hold nothing; one past 2^16 positions (twice the
# published max_position_embeddings) is a typo that would reserve tens of GB per take.
MIN_SEQ_LEN, MAX_SEQ_LEN = 16, 1 << 16
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d{1,3})?)$")


@dataclass(frozen=True)
class EngineConfig:
    """How to load a checkpoint.

    model_dir    a Qwen3-TTS-12Hz checkpoint folder (official layout)
    device       auto (CUDA when present) | cpu | cuda | cuda:N
    dtype        auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
    cuda_graphs  auto | on | off: whole frames, the prefill and the codec as captured CUDA graphs
    triton       auto | on | off: the Triton kernels of a frame and of the codec
    max_takes    rows one call may decode at once (takes of a line, lines of a batch, or a scheduler's
                 requests together), 1..64; each row holds its own K/V cache
    max_seq_len  positions of each row's K/V cache (prompt + frames)
    codec_dir    another checkpoint (or its speech_tokenizer/ folder) whose codec to use; "" = the
                 checkpoint's own, or a compatible sibling's when it has none
    warm_takes   with CUDA graphs, the load also captures the graphs of this many rows, so calls of up to
                 this many rows never wait for a capture (each row holds its own K/V cache)
    batch_invariant  every row decodes to the same codes whatever rows run beside it (a request served under
                 load equals it served alone, in bf16 too): the Triton kernels plan each launch as for the
                 largest batch. A scheduler's codec decodes every slot one frame at a time, so a request's samples
                 under load equal its samples served alone by the same scheduler, bit for bit; cuDNN runs its
                 deterministic algorithms (a switch of the whole process). Needs the Triton kernels; a frame of few
                 rows costs more (docs/PERFORMANCE_NOTES.md)
    """

    model_dir: str
    device: str = "auto"
    dtype: str = "auto"
    cuda_graphs: str = "auto"
    triton: str = "auto"
    max_takes: int = MAX_TAKES
    max_seq_len: int = 4096
    codec_dir: str = ""
    warm_takes: int = 1
    batch_invariant: bool = False

    def __post_init__(self):
        # Paths are kept as absolute strings: two spellings of one folder are one cache key.
        object.__setattr__(self, "model_dir", _absolute(self.model_dir))
        object.__setattr__(self, "codec_dir", _absolute(self.codec_dir) if self.codec_dir else "")  # None, "": own

    def replace(self, **changes) -> EngineConfig:
        return replace(self, **changes)

    def check(self) -> None:
        """Every field, before any work (Engine.load calls it): a typed error naming the field and what to do."""
        _check_folder("model_dir", self.model_dir)
        if self.codec_dir:
            _check_folder("codec_dir", self.codec_dir)
        self.check_settings()

    def check_settings(self, label=None) -> None:
        """Every field but the folders (the CLI checks them before it writes its default checkpoint). label(field)
        is the name a message gives a field (the CLI names its options); default the field's."""
        name = label or (lambda field: field)
        if not isinstance(self.device, str) or not _DEVICE.match(self.device):
            raise UnsupportedConfigError(f"{name('device')} must be auto, cpu, cuda or cuda:N (got {self.device!r}).")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_NAMES:
            raise UnsupportedConfigError(f"{name('dtype')} must be one of {', '.join(DTYPE_NAMES)} "
                                         f"(got {self.dtype!r}).")
        for field in ("cuda_graphs", "triton"):
            value = getattr(self, field)
            if not isinstance(value, str) or value not in SWITCHES:
                raise UnsupportedConfigError(f"{name(field)} must be one of {', '.join(SWITCHES)} (got {value!r}).")
        if not isinstance(self.batch_invariant, bool):
            raise UnsupportedConfigError(f"{name('batch_invariant')} must be true or false "
                                         f"(got {self.batch_invariant!r}).")
        checks.whole_number(name("max_takes"), self.max_takes, 1, MAX_ROWS)
        checks.whole_number(name("warm_takes"), self.warm_takes, 1, self.max_takes,
                            f"It cannot exceed {name('max_takes')}.")
        checks.whole_number(name("max_seq_len"), self.max_seq_len, MIN_SEQ_LEN, MAX_SEQ_LEN,
                            "It is the K/V cache length of each take (prompt tokens + frames); 4096 holds "
                            "about 5 minutes of audio.")


def _check_folder(name: str, path) -> None:
    """A folder given as a load argument: a non-empty path to an existing, readable directory."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise InvalidInputError(f"{name} must be the path of a checkpoint folder (got {path!r}).")
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{name} {p} does not exist; give the checkpoint folder (the one that holds "
                              "config.json).")
    if not p.is_dir():
        raise CheckpointError(f"{name} {p} is a file, not a folder; give the checkpoint folder that holds it.")
    if not os.access(p, os.R_OK | os.X_OK):
        raise CheckpointError(f"{name} {p} is not readable; check its permissions.")


def _absolute(path) -> str:
    if isinstance(path, (str, Path)) and str(path):
        return str(Path(path).expanduser().absolute())
    return path  # Engine.load reports what is wrong with it
