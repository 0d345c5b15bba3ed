"""Deterministic random weights, chosen by module type and parameter role (OFFLINE_TESTING.md §4.1).

Every tensor gets its own generator seeded from (seed, crc32(full state-dict name)), so a tensor's
values depend only on the seed, its name and its shape: not on the order of construction, on the module
implementation holding it (ours or the official one, whose names are identical), or on the torch thread
count. Values are drawn in float32 on the CPU and cast afterwards.

Rules:
  Linear / Conv weights        N(0, 1/fan_in)
  Embeddings, codebook sums    N(0, 1)
  norm weights                 1          norm and other biases    0
  layer scale                  0.01       ConvNeXt gamma           1e-6
  SnakeBeta alpha / beta       0 (log scale, i.e. factor 1)
  codebook cluster_usage, initialized     1
  codec decoder waveform stack (decoder.decoder.*): every conv weight x0.5, and the final conv x3.5
    instead. With unit-gain random weights the four upsampling blocks amplify fp32 rounding ~1000x (one
    fp32 pass is ~6e-5 away from fp64), which no trained decoder does; halved, the floor is ~1e-6 and
    the output stays out of clipping (rms ~0.2).
"""
from __future__ import annotations

import re
import zlib

import torch
from torch import nn

LAYER_SCALE = 0.01
CONVNEXT_GAMMA = 1e-6
FINAL_CONV_SCALE = 3.5
WAVEFORM_CONV_SCALE = 0.5

_WAVEFORM_CONV = re.compile(r"(?:^|\.)decoder\.decoder\.\d+\..*conv\.weight$")

_FINAL_CONV = re.compile(r"(?:^|\.)decoder\.decoder\.(\d+)\.conv\.weight$")


def tensor_seed(seed: int, name: str) -> int:
    """The generator seed of one tensor: crc32 of its name, started from the run seed (mod 2**32).

    32 bits because torch's CPU generator (mt19937) keeps only the low 32 bits of a seed. For a fixed
    name the map seed -> tensor seed is a bijection, and seed 0 gives plain crc32(name).
    """
    return zlib.crc32(name.encode("utf-8"), int(seed) & 0xFFFFFFFF)


def _normal(name: str, shape: tuple[int, ...], std: float, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(tensor_seed(seed, name))
    out = torch.randn(shape, generator=g, dtype=torch.float32)
    if std != 1.0:
        out.mul_(std)
    return out


def _is_norm(module: nn.Module | None) -> bool:
    if module is None:
        return False
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.RMSNorm)):
        return True
    return type(module).__name__.endswith("Norm")


def _fan_in(module: nn.Module | None, shape: tuple[int, ...]) -> float | None:
    """Inputs feeding one output value, or None when the module type gives no rule."""
    if isinstance(module, nn.Linear):
        return module.in_features
    if isinstance(module, nn.ConvTranspose1d):
        # weight [in, out/groups, k]; each output sample sees about k/stride taps of each input channel
        in_per_group = shape[0] // module.groups
        return max(1.0, in_per_group * shape[2] / module.stride[0])
    if isinstance(module, nn.Conv1d):
        return shape[1] * shape[2]  # weight [out, in/groups, k]
    return None


def tensor_role(name: str, shape: tuple[int, ...], module: nn.Module | None) -> tuple[str, float]:
    """("normal", std) or ("const", value) for the state-dict entry `name` held by `module`.

    Raises ValueError for a tensor no rule covers, so a new parameter never gets a silent default.
    """
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("cluster_usage", "initialized"):
        return "const", 1.0
    if leaf in ("embedding_sum", "embed_sum"):
        return "normal", 1.0
    if leaf == "gamma" and len(shape) == 1:
        return "const", CONVNEXT_GAMMA
    if leaf in ("alpha", "beta") and len(shape) == 1:
        return "const", 0.0
    if leaf == "scale" and "layer_scale" in name and len(shape) == 1:
        return "const", LAYER_SCALE
    if leaf == "bias" and len(shape) == 1:
        return "const", 0.0
    if leaf == "weight":
        if isinstance(module, nn.Embedding):
            return "normal", 1.0
        if _is_norm(module) and len(shape) == 1:
            return "const", 1.0
        fan_in = _fan_in(module, shape)
        if fan_in is not None:
            return "normal", float(fan_in) ** -0.5
    raise ValueError(
        f"no random-init rule for tensor '{name}' of shape {list(shape)} held by "
        f"{type(module).__name__ if module is not None else 'an unknown module'}; add one to "
        "engine/checkpoint/random_init.py"
    )


def final_codec_conv(names) -> str | None:
    """The codec decoder's last conv weight among full state-dict names (highest decoder.decoder index)."""
    best, best_idx = None, -1
    for n in names:
        m = _FINAL_CONV.search(n)
        if m and int(m.group(1)) > best_idx:
            best, best_idx = n, int(m.group(1))
    return best


def init_tensor(name: str, shape: tuple[int, ...], module: nn.Module | None, seed: int, *,
                final_conv: bool = False) -> torch.Tensor:
    """A fresh float32 CPU tensor for one state-dict entry (full checkpoint name)."""
    shape = tuple(int(s) for s in shape)
    kind, value = tensor_role(name, shape, module)
    if kind == "const":
        return torch.full(shape, value, dtype=torch.float32)
    out = _normal(name, shape, value, seed)
    if final_conv:
        out.mul_(FINAL_CONV_SCALE)
    elif _WAVEFORM_CONV.search(name):
        out.mul_(WAVEFORM_CONV_SCALE)
    return out


def state_entries(module: nn.Module, prefix: str = "") -> list[tuple[str, str, torch.Tensor, nn.Module]]:
    """(full name, local name, tensor, owning module) for every parameter and persistent buffer."""
    modules = dict(module.named_modules())
    out = []
    for local, t in module.state_dict(keep_vars=True).items():
        owner = modules.get(local.rsplit(".", 1)[0]) if "." in local else module
        out.append((prefix + local, local, t, owner))
    return out


@torch.no_grad()
def init_module(module: nn.Module, seed: int, *, prefix: str = "") -> nn.Module:
    """Fill every parameter and persistent buffer of a materialised module in place; return the module.

    `prefix` is prepended to the module's own state-dict names to form the checkpoint names that seed
    the generators (e.g. "talker." for the talker), so a submodule gets the values it has in a checkpoint.
    Non-persistent buffers (RoPE tables, conv geometry) are left alone.
    """
    entries = state_entries(module, prefix)
    final = final_codec_conv(e[0] for e in entries)
    for full, _local, t, owner in entries:
        if t.is_meta:
            raise ValueError(f"init_module needs a materialised module ('{full}' is on meta); "
                             "use module.to_empty(device='cpu') first")
        t.copy_(init_tensor(full, tuple(t.shape), owner, seed, final_conv=(full == final)))
    return module
