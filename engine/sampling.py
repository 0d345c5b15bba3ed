"""On-device sampling with no host sync.

* Logits processing for codebook 0 mirrors upstream (HF generate): repetition penalty over the ids
  generated so far, suppression of the control ids 2048..3071 except EOS, EOS masked until
  `min_new_tokens`, then temperature, top-k, top-p.
* Every take draws from its own random stream. The stream is a counter-based hash of
  (seed, take index, frame, slot, token id), so take i of a batch equals take i generated alone,
  the same seed gives the same output on any device, and nothing needs a generator object that a
  CUDA graph would have to capture.
* A categorical draw is the exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) picks i with
  probability p_i exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from . import checks
from .errors import InvalidInputError
from .limits import TAKE_STREAMS

_M32 = 0xFFFFFFFF
# Sanity limits: beyond them a value is a typo, not a setting (temperature 100 is already uniform noise).
MAX_NEW_TOKENS = 1 << 20
MAX_TOP_K = (1 << 31) - 1
MAX_TEMPERATURE = 100.0
MAX_REPETITION_PENALTY = 100.0


@dataclass(frozen=True)
class SamplingParams:
    """Per-call sampling settings; `subtalker_*` apply to codebooks 1..15 (the code predictor)."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 2048
    min_new_tokens: int = 2

    def replace(self, **changes) -> "SamplingParams":
        return replace(self, **changes)

    def validate(self, label=None) -> "SamplingParams":
        """Raise InvalidInputError naming the first field that is of the wrong type, NaN, infinite or out of range.
        label(field) is the name the message gives a field (the CLI names its options); default the field's."""
        name = label or (lambda field: field)
        checks.whole_number(name("max_new_tokens"), self.max_new_tokens, 1, MAX_NEW_TOKENS,
                            "It caps the codec frames of one segment (12.5 per second).")
        checks.whole_number(name("min_new_tokens"), self.min_new_tokens, 0, self.max_new_tokens,
                            f"It must not exceed {name('max_new_tokens')}.")
        for prefix, switch in (("", "do_sample"), ("subtalker_", "subtalker_dosample")):
            checks.flag(name(switch), getattr(self, switch))
            checks.real_number(name(prefix + "temperature"), getattr(self, prefix + "temperature"), 0.0,
                               MAX_TEMPERATURE, lo_open=True, hint="Around 0.9 is typical; for deterministic output "
                                                                   "use greedy decoding instead of 0.")
            checks.whole_number(name(prefix + "top_k"), getattr(self, prefix + "top_k"), 0, MAX_TOP_K,
                                "0 disables top-k; around 50 is typical.")
            checks.real_number(name(prefix + "top_p"), getattr(self, prefix + "top_p"), 0.0, 1.0, lo_open=True,
                               hint="1.0 disables nucleus sampling.")
        checks.real_number(name("repetition_penalty"), self.repetition_penalty, 0.0, MAX_REPETITION_PENALTY,
                           lo_open=True, hint="1.0 disables it; around 1.05 is typical.")
        return self

    @classmethod
    def from_generation_config(cls, config: dict) -> "SamplingParams":
        """The checkpoint's generation_config.json over upstream's hard defaults (this class's defaults)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: config[k] for k in names if k in config})

    def greedy(self) -> "SamplingParams":
        return replace(self, do_sample=False, subtalker_dosample=False)

    def capped(self, max_new_tokens: int) -> "SamplingParams":
        """These settings with a frame budget of `max_new_tokens`; a min_new_tokens above it comes down to it
        (a budget the caller chose wins over the checkpoint's floor)."""
        return replace(self, max_new_tokens=max_new_tokens, min_new_tokens=max(0, min(self.min_new_tokens,
                                                                                        max_new_tokens)))


# ---------------------------------------------------------------------------------------------
# Counter-based random streams


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (two multiply-xorshift rounds) on int64 tensors holding 32-bit values."""
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _M32
    x = ((x ^ (x >> 15)) * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def check_take_range(first_take: int, takes: int) -> None:
    """Takes first_take .. first_take + takes - 1 must be streams that take_keys tells apart (32-bit indices)."""
    first_take, takes = checks.integer("first_take", first_take), checks.integer("takes", takes)
    if first_take < 0:
        raise InvalidInputError(f"first_take must be 0 or more (got {first_take}).")
    if first_take + takes > TAKE_STREAMS:
        raise InvalidInputError(
            f"first_take {first_take} with {takes} take(s) reaches take index {first_take + takes - 1}, but take "
            f"indices end at {TAKE_STREAMS - 1}. Use a first_take of at most {TAKE_STREAMS - takes}, or fewer takes."
        )


def take_keys(seed: int, take_indices, device) -> torch.Tensor:
    """One 32-bit stream key per take, derived from (seed, take index). Seeds may use all 64 bits."""
    seed = int(seed) & ((1 << 64) - 1)
    lo, hi = seed & _M32, (seed >> 32) & _M32
    takes = torch.as_tensor(list(take_indices), dtype=torch.int64, device=device)
    k = _mix32((_mix32(takes + 0x3C6EF372) ^ lo) & _M32)
    return _mix32(k ^ hi)


def uniforms(keys: torch.Tensor, step, slot: int, width: int) -> torch.Tensor:
    """Uniform floats in (0, 1), shape [B, width], for draw (step, slot) of each take's stream.

    `step` may be an int, or an int64 tensor with one element or one per take (rows of a batch are at
    different frames), so a captured graph can advance it on the device.
    """
    if torch.is_tensor(step):
        step = step.reshape(-1)
    base = _mix32((keys + step * 0x9E3779B9 + slot * 0x85EBCA6B) & _M32)  # [B]
    idx = torch.arange(width, device=keys.device, dtype=torch.int64) * 0xC2B2AE35 & _M32
    return unit_interval(_mix32(_mix32(base[:, None] ^ idx[None, :]) ^ keys[:, None]))


def frame_uniforms(keys: torch.Tensor, step, slots: int, width: int) -> torch.Tensor:
    """uniforms(keys, step, slot, width) for slots 0..slots-1 at once: [B, slots, width] (same values)."""
    if torch.is_tensor(step):
        step = step.reshape(-1, 1)
    slot = torch.arange(slots, device=keys.device, dtype=torch.int64)
    base = _mix32((keys[:, None] + step * 0x9E3779B9 + slot[None, :] * 0x85EBCA6B) & _M32)  # [B, slots]
    idx = torch.arange(width, device=keys.device, dtype=torch.int64) * 0xC2B2AE35 & _M32
    return unit_interval(_mix32(_mix32(base[:, :, None] ^ idx) ^ keys[:, None, None]))


def unit_interval(x: torch.Tensor) -> torch.Tensor:
    """32-bit hashes -> floats strictly inside (0, 1). 23 bits, so (k + 0.5) / 2^23 is exact in float32
    and never rounds to 1 (a u of 1 would make -log(u) zero and the race divide by zero)."""
    return ((x >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


# ---------------------------------------------------------------------------------------------
# Logits processing and choice


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty) -> torch.Tensor:
    """HF repetition penalty: for ids already generated, l -> l / p if l > 0 else l * p. `penalty` is a float,
    or in the captured graphs a device tensor, 0-d or one per row (applied always: dividing or multiplying by
    1.0 is exact)."""
    if isinstance(penalty, float) and penalty == 1.0:
        return logits
    if torch.is_tensor(penalty) and penalty.dim() > 0:
        penalty = penalty.reshape(-1, 1)  # row b's setting over row b's ids
    hit = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, hit, logits)


def control_mask(vocab: int, eos_id: int, device) -> torch.Tensor:
    """Boolean [vocab]: True for ids c0 may never take (2048..3071 except EOS, as upstream)."""
    mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    mask[vocab - 1024:] = True
    mask[eos_id] = False
    return mask


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """HF top-k (keep ids whose logit >= the k-th largest) then top-p (smallest set with mass >= p)."""
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False  # always keep the most likely id
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def choose(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int, top_p: float,
           u: torch.Tensor | None) -> torch.Tensor:
    """Pick one id per row from float32 logits [B, V]: argmax, or a draw using uniforms u [B, V]."""
    if not do_sample:
        return torch.argmax(logits, dim=-1)
    logits = filter_top_k_top_p(logits / temperature, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    race = probs / (-torch.log(u))
    return torch.argmax(race, dim=-1)
