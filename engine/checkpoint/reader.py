"""Read a checkpoint directory with typed errors: missing files, missing keys, wrong shapes, damaged files.

Weights are read through safetensors' memory map one tensor at a time and cast per tensor, so loading a
model costs about one copy of its weights in the target dtype.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

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
                t = f.get_tensor(key)
                if t.is_floating_point() and dtype is not None:
                    t = t.to(device=device, dtype=dtype)
                else:
                    t = t.to(device=device)
                if current.dim() > 1 and current.stride() != t.stride():  # keep a layout the module chose
                    t = torch.empty_strided(current.shape, current.stride(), dtype=t.dtype, device=device).copy_(t)
                owner, attr = _owner(module, local)
                if attr in owner._parameters:
                    owner._parameters[attr] = nn.Parameter(t, requires_grad=current.requires_grad)
                else:
                    owner._buffers[attr] = t
                del t
            extra = sorted(k for k in keys if k.startswith(prefix) and k[len(prefix):] not in target)
            if extra:
                raise CheckpointError(
                    f"{path} has unexpected tensor '{extra[0]}'"
                    + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
                    + f" under '{prefix}'; the file belongs to a different model version or type.")
    except CheckpointError:
        raise
    except _damage_errors() as exc:  # data errors can surface lazily from the memory map
        raise CheckpointError(
            f"{path} could not be read ({type(exc).__name__}: {exc}); it is probably truncated or corrupted. "
            "Delete it and download it again.") from exc
    return module
