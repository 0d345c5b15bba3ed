"""Loaded engines, keyed by their configuration, registered with ComfyUI's memory management.

The loader node outputs a small `ModelRef` (configuration + facts), never the engine itself; every node
that needs the engine calls `acquire(ref)`. Each loaded engine is represented to ComfyUI by a
ModelPatcher around a weightless stand-in module whose size is the checkpoint's weight bytes plus what the load
reserved for its graphs and their K/V caches (EngineInfo.graph_bytes: max_takes rows of cache), so that
ComfyUI makes room for it, and so that "Unload models", "Free model and node cache" and ComfyUI's OOM
recovery unload it: the patcher's ON_DETACH callback calls `engine.release()` and drops the entry. The
next `acquire` loads it again (and that load captures its CUDA graphs again).
"""
from __future__ import annotations

import gc
import logging
import os
import threading
from dataclasses import dataclass

import torch

import comfy.model_management as mm
import comfy.model_patcher
from comfy.patcher_extension import CallbacksMP

from ..engine.engine_config import EngineConfig
from ..engine.remote.config import RemoteConfig

log = logging.getLogger(__name__)
MAX_ENGINES = 2  # distinct configurations kept loaded at once; the least recently used is released


@dataclass(frozen=True)
class ModelRef:
    """What flows through the QWEN3TTS_MODEL socket."""

    key: EngineConfig | RemoteConfig  # how the engine is loaded (or reached), and its key in this cache
    name: str
    model_type: str  # base | custom_voice | voice_design


class _Standin(torch.nn.Module):
    """Weightless module: ComfyUI accounts for `size` bytes and calls our ON_DETACH hook to unload."""


@dataclass
class _Entry:
    engine: object
    patcher: object


_lock = threading.RLock()
_entries: dict[EngineConfig, _Entry] = {}
_graveyard: list[_Entry] = []  # released entries whose patchers ComfyUI may still be iterating over


def comfy_device() -> str:
    dev = mm.get_torch_device()
    if dev.type == "cpu" or dev.index in (None, 0):
        return dev.type
    return f"{dev.type}:{dev.index}"


def _weight_bytes(model_dir: str, codec_dir: str) -> int:
    total = 0
    for folder in (model_dir, codec_dir):
        p = os.path.join(folder, "model.safetensors")
        if os.path.isfile(p):
            total += os.path.getsize(p)
    return max(total, 1)


def _on_load(patcher, device_to, lowvram_model_memory, force_patch_weights, full_load):
    """The stand-in has no weights; report the engine's real size as loaded so ComfyUI keeps it."""
    patcher.model.model_loaded_weight_memory = patcher.model_size()


def _on_detach(key: EngineConfig):
    def callback(patcher, unpatch_all):  # signature fixed by ComfyUI (CallbacksMP.ON_DETACH)
        if not unpatch_all:  # ComfyUI re-patching a model it keeps loaded (load_models_gpu on a loaded model)
            return
        with _lock:
            entry = _entries.get(key)
            if entry is None or entry.patcher is not patcher:  # an older, already released entry
                return
            # Runs inside ComfyUI's free_memory loop: keep the patcher referenced until the next acquire
            # (collecting it here would edit ComfyUI's loaded-model list while it is being walked).
            _graveyard.append(entry)
        release(key, reason="ComfyUI unloaded it", collect=False)
    return callback


def _load(key: EngineConfig) -> _Entry:
    from ..engine import Engine  # heavy: only when a model is really needed

    log.info("Qwen3-TTS: loading %s (device=%s dtype=%s graphs=%s triton=%s max_takes=%d)", key.model_dir,
             key.device, key.dtype, key.cuda_graphs, key.triton, key.max_takes)
    engine = Engine.load(key)
    patcher = comfy.model_patcher.ModelPatcher(_Standin(), load_device=mm.get_torch_device(),
                                               offload_device=mm.unet_offload_device(),
                                               size=_weight_bytes(key.model_dir, engine.info.codec_dir)
                                               + engine.info.graph_bytes)  # its graphs and K/V caches too
    patcher.add_callback(CallbacksMP.ON_LOAD, _on_load)
    patcher.add_callback(CallbacksMP.ON_DETACH, _on_detach(key))
    return _Entry(engine, patcher)


_remote: dict[RemoteConfig, object] = {}  # servers reached, by configuration: they hold no memory here


def connect(url: str, api_key: str | None):
    """A RemoteEngine for the server at `url`, asked afresh what it serves (it may have been restarted with
    another checkpoint), and kept for the nodes that acquire its configuration."""
    from ..engine.remote import RemoteEngine

    engine = RemoteEngine.connect(url, api_key)
    with _lock:
        _remote[engine.config] = engine
    return engine


def acquire(key: EngineConfig | RemoteConfig):
    """The engine for `key`, loaded if needed and marked in use for ComfyUI's memory manager; for a server, the
    RemoteEngine that reaches it."""
    if isinstance(key, RemoteConfig):
        with _lock:
            engine = _remote.get(key)
        return engine if engine is not None else connect(key.url, key.api_key)
    with _lock:
        _graveyard.clear()
        entry = _entries.pop(key, None)
        if entry is None:
            while len(_entries) >= MAX_ENGINES:
                release(next(iter(_entries)), reason="engine cache full")
            entry = _load(key)
        _entries[key] = entry  # most recently used last
    mm.load_models_gpu([entry.patcher], force_full_load=True)
    with _lock:
        if key not in _entries:  # ComfyUI unloaded it again while making room: load once more
            return acquire(key)
    return entry.engine


def release(key: EngineConfig, reason: str = "", collect: bool = True) -> bool:
    """Release one engine's memory and forget it. Safe to call for keys that are not loaded."""
    with _lock:
        entry = _entries.pop(key, None)
    if entry is None:
        return False
    log.info("Qwen3-TTS: releasing %s%s", key.model_dir, f" ({reason})" if reason else "")
    try:
        entry.engine.release()
    finally:
        entry.engine = None
        if collect:
            gc.collect()
        mm.soft_empty_cache()
    return True


def loaded() -> list[dict]:
    """Summary of loaded engines (for the status route and tests)."""
    with _lock:
        return [{"model_dir": k.model_dir, "device": k.device, "dtype": k.dtype, "max_takes": k.max_takes}
                for k in _entries]
