"""EngineConfig: everything a load decides, frozen, so one value is both the load's argument and a cache key."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .limits import MAX_TAKES

SWITCHES = ("auto", "on", "off")


@dataclass(frozen=True)
class EngineConfig:
    """How to load a checkpoint.

    model_dir    a Qwen3-TTS-12Hz checkpoint folder (official layout)
    device       auto (CUDA when present) | cpu | cuda | cuda:N
    dtype        auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
    cuda_graphs  auto | on | off: whole frames, the prefill and the codec as captured CUDA graphs
    triton       auto | on | off: the Triton kernels of a frame and of the codec
    max_takes    rows one call may decode at once (takes of a line, or lines of a batch), 1..16
    max_seq_len  positions of each row's K/V cache (prompt + frames)
    codec_dir    another checkpoint (or its speech_tokenizer/ folder) whose codec to use; "" = the
                 checkpoint's own, or a compatible sibling's when it has none
    warm_takes   with CUDA graphs, the load also captures the graphs of this many rows, so calls of up to
                 this many rows never wait for a capture (each row holds its own K/V cache)
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

    def __post_init__(self):
        # Paths are kept as absolute strings: two spellings of one folder are one cache key.
        object.__setattr__(self, "model_dir", _absolute(self.model_dir))
        object.__setattr__(self, "codec_dir", _absolute(self.codec_dir) if self.codec_dir else "")  # None, "": own

    def replace(self, **changes) -> EngineConfig:
        return replace(self, **changes)


def _absolute(path) -> str:
    if isinstance(path, (str, Path)) and str(path):
        return str(Path(path).expanduser().absolute())
    return path  # Engine.load reports what is wrong with it
