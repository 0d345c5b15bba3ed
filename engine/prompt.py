"""Prompt building: a request becomes prefill embeddings plus the text fed alongside each decode step.

The layouts follow the official package (QWEN3_TTS_FACTS.md §6). Templates are tokenized whole and
then sliced by position, exactly as upstream does, so the first text token and the role tokens match.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from . import checks
from .config import ModelConfig
from .content_key import content_key
from .errors import InvalidInputError, ModeError
from .kept import Kept
from .transfer import device_longs, to_device
from .voice import Voice

log = logging.getLogger(__name__)

MODES = ("custom", "design", "clone")
MODE_OF_MODEL = {"custom_voice": "custom", "voice_design": "design", "base": "clone"}
CHECKPOINT_OF_MODE = {"custom": "CustomVoice", "design": "VoiceDesign", "clone": "Base"}
DEFAULT_NON_STREAMING = {"custom": True, "design": True, "clone": False}
VOICES_KEPT = 16  # voices whose ICL reference embeddings a builder keeps (least recently used dropped first)


@dataclass
class Request:
    """One line of speech to synthesise. `voice` is an engine.voice.Voice (clone mode only)."""

    mode: str
    text: str
    language: str | None = "auto"
    speaker: str | None = None
    instruct: str | None = None
    voice: object | None = None
    non_streaming_mode: bool | None = None
    icl: bool | None = None  # clone only: None uses ICL when the voice carries reference codes


@dataclass
class Prompt:
    prefill: torch.Tensor  # [1, L, H]
    trailing: torch.Tensor  # [T, H]: added to the decode input of step t while t < T, else pad
    pad_embed: torch.Tensor  # [H]
    ref_codes: torch.Tensor | None = None  # [R, 16] ICL reference codes (decoded as left context)
    notes: list = field(default_factory=list)


def expected_frames(text: str) -> int:
    """A rough guess of the frames a text takes to speak (12.5 frames/s; ~15 Latin or ~4.5 CJK characters
    per second). Only used to order batch rows and to estimate a progress total, never to cut audio."""
    cjk = sum(1 for c in text if 0x3040 <= ord(c) <= 0x30FF or 0x3400 <= ord(c) <= 0x9FFF or 0xAC00 <= ord(c) <= 0xD7AF)
    return int(12.5 * ((len(text) - cjk) / 15 + cjk / 4.5)) + 8


def _template(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def _ref_template(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def _instruct_template(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n"


def resolve_language(cfg: ModelConfig, language: str | None, speaker: str | None) -> int | None:
    """Codec language id, or None for auto. Dialect speakers turn chinese/auto into their dialect."""
    lang = (language or "auto").strip().lower()
    if lang not in cfg.supported_languages:
        raise InvalidInputError(
            f"unknown language '{language}'. Choose one of: {', '.join(x.capitalize() for x in cfg.supported_languages)}."
        )
    lang_id = None if lang == "auto" else cfg.talker.language_ids[lang]
    if speaker and lang in ("chinese", "auto"):
        dialect = cfg.talker.speaker_dialect.get(speaker.lower(), False)
        if dialect:
            lang_id = cfg.talker.language_ids[dialect]
    return lang_id


def check_request(req: Request) -> None:
    """Types of the request's fields: what a caller typed must not reach the tokenizer as a TypeError."""
    checks.text_value("mode", req.mode)
    if req.text is None:
        raise InvalidInputError("the text is empty; type the words to speak.")
    checks.text_value("text", req.text)
    for name in ("language", "speaker", "instruct"):
        checks.text_value(name, getattr(req, name), optional=True)
    if req.voice is not None and not checks.same_kind(req.voice, Voice):
        raise InvalidInputError(f"voice must be an engine Voice (got {type(req.voice).__name__}); load it with "
                                "Voice.load(path) or make it with Engine.extract_voice.")
    for name in ("non_streaming_mode", "icl"):
        if getattr(req, name) is not None:
            checks.flag(name, getattr(req, name))


def check_mode(cfg: ModelConfig, mode: str) -> None:
    if mode not in MODES:
        raise InvalidInputError(f"unknown mode '{mode}'; use one of {', '.join(MODES)}.")
    native = MODE_OF_MODEL[cfg.tts_model_type]
    if mode != native:
        raise ModeError(
            f"this is a {cfg.tts_model_type} checkpoint, which cannot do '{mode}'. "
            f"Use mode '{native}' with it, or load a {CHECKPOINT_OF_MODE[mode]} checkpoint for '{mode}'."
        )


class PromptBuilder:
    """Builds prompts for one loaded model. `talker` provides embed_text / embed_codec and the
    code predictor's residual embeddings; `tokenizer` provides encode(str) -> list[int]."""

    def __init__(self, cfg: ModelConfig, talker, tokenizer):
        self.cfg, self.talker, self.tok = cfg, talker, tokenizer
        # Embeddings of fixed ids (the text markers, the role tokens, codec tags and speakers), made once: every
        # prompt repeats them, and each made anew cost a blocking host-to-device copy and a few launches before
        # the prefill (~1 ms a request). Same ids through the same shapes give the same values.
        self._fixed: dict[tuple, torch.Tensor] = {}
        # The ICL reference of a voice, as every prompt with that voice uses it (_reference): a server's requests
        # name a few saved voices again and again, and each made anew cost two host-to-device copies and ~20
        # launches in the request's path.
        self._references = Kept(VOICES_KEPT)

    def _device(self) -> torch.device:
        return self.talker.model.codec_embedding.weight.device

    def _ids(self, text: str) -> torch.Tensor:
        return device_longs(self.tok.encode(text), self._device())

    def _once(self, embed, ids: tuple) -> torch.Tensor:
        """embed(ids) [len(ids), H], made at the first call and then shared by every prompt (read only)."""
        key = (embed.__name__, ids)
        if key not in self._fixed:
            self._fixed[key] = embed(device_longs(list(ids), self._device()))
        return self._fixed[key]

    def forget(self) -> None:
        """Drop the fixed embeddings and the kept references (their device memory; Engine.release moves the weights
        to the CPU). They are made again, where the weights are, on next use."""
        self._fixed.clear()
        self._references.clear()

    def _fixed_text(self, ids: tuple) -> torch.Tensor:
        """embed_text of fixed token ids [len(ids), H] (read only: shared by every prompt)."""
        return self._once(self.talker.embed_text, ids)

    def _codec(self, ids) -> torch.Tensor:
        """The codec embedding of `ids` [len(ids), H] (read only: shared by every prompt). A run of one id
        (the pad under a text) is that id's row repeated, so lengths do not grow the table."""
        ids = tuple(int(i) for i in ids)
        if len(ids) > 1 and len(set(ids)) == 1:
            return self._codec(ids[:1]).expand(len(ids), -1)
        return self._once(self.talker.embed_codec, ids)

    def _reference(self, voice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(reference codes [R, 16] long, the reference text's token ids on the device, K: the codec bos and each
        reference frame's embedding [R + 1, H]) of an ICL voice, kept for the VOICES_KEPT voices used last (read
        only: shared by every prompt). Keyed by content, so a voice loaded again from its file finds them."""
        codes = voice.ref_codes.to(torch.long).cpu()
        key = (content_key(codes), voice.ref_text)
        kept = self._references.get(key)
        if kept is None:
            ids = self._ids(_ref_template(voice.ref_text))[3:-2]
            bos = self._codec([self.cfg.talker.codec_bos_id])
            kept = self._references.put(key, (codes, ids, torch.cat([bos, self.frame_embeddings(codes)], 0)))
        return kept

    def frame_embeddings(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the 16 codebook embeddings of each frame, [R, 16] -> [R, H]."""
        codes = to_device(codes, self._device())
        return self.talker.code_predictor.residual_embedding_sum(codes[:, 1:], self.talker.embed_codec(codes[:, 0]))

    @torch.inference_mode()
    def build(self, req: Request) -> Prompt:
        cfg, tc = self.cfg, self.cfg.talker
        check_request(req)
        check_mode(cfg, req.mode)
        text = req.text
        checks.visible_text("text", text, "type the words to speak.")
        notes = []

        speaker = None
        if req.mode == "custom":
            if not req.speaker or req.speaker.strip().lower() not in tc.speaker_ids:
                raise InvalidInputError(
                    f"unknown speaker '{req.speaker}'. Choose one of: {', '.join(cfg.supported_speakers)}."
                )
            speaker = req.speaker.strip().lower()
        lang_id = resolve_language(cfg, req.language, speaker)

        instruct = (req.instruct or "").strip() if req.mode in ("custom", "design") else ""
        if instruct and cfg.instruct_ignored:
            msg = "instruct is ignored by the 0.6B CustomVoice model (as upstream); use a 1.7B CustomVoice model to honour it."
            log.warning(msg)
            notes.append(msg)
            instruct = ""

        pad, bos, eos = self._fixed_text((cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id)).unbind(0)

        # Codec prefix: think tags (+ language), optional speaker slot, then pad and bos.
        tags = ([tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id] if lang_id is None
                else [tc.codec_think_id, tc.codec_think_bos_id, lang_id, tc.codec_think_eos_id])
        parts = [self._codec(tags)]
        voice = req.voice if req.mode == "clone" else None
        if req.mode == "clone":
            if voice is None:
                raise InvalidInputError("voice clone needs a voice: extract one from reference audio first.")
            voice.check_compatible(cfg)
            parts.append(to_device(voice.spk_embedding, parts[0].device).to(parts[0].dtype).view(1, -1))
        elif speaker is not None:
            parts.append(self._codec([tc.speaker_ids[speaker]]))
        parts.append(self._codec([tc.codec_pad_id, tc.codec_bos_id]))
        codec_prefix = torch.cat(parts, 0)  # [n, H]
        n = codec_prefix.shape[0]

        tokens = self.tok.encode(_template(text))
        if len(tokens) < 9:
            raise InvalidInputError("the text produced no tokens; type the words to speak.")
        role = self._fixed_text(tuple(tokens[:3]))
        text_ids = device_longs(tokens[3:-5], self._device())
        head = torch.cat([pad.expand(n - 2, -1), bos[None]], 0) + codec_prefix[:-1]
        seq = [role, head]
        if instruct:
            seq.insert(0, self.talker.embed_text(self._ids(_instruct_template(instruct))))

        use_icl = False
        if voice is not None:
            has_codes = getattr(voice, "ref_codes", None) is not None
            use_icl = has_codes if req.icl is None else bool(req.icl)
            if use_icl and not has_codes:
                raise InvalidInputError("ICL cloning needs a voice extracted with its reference text; "
                                        "re-extract the voice with ref_text, or switch ICL off.")
        non_streaming = DEFAULT_NON_STREAMING[req.mode] if req.non_streaming_mode is None else bool(req.non_streaming_mode)

        ref_codes = None
        if use_icl:
            ref_codes, ref_ids, codec_embed = self._reference(voice)
            text_embed = torch.cat([self.talker.embed_text(torch.cat([ref_ids, text_ids])), eos[None]], 0)
            if non_streaming:
                seq.append(text_embed + self._codec([tc.codec_pad_id] * text_embed.shape[0]))
                seq.append(codec_embed + pad)
                trailing = pad[None]
            elif text_embed.shape[0] > codec_embed.shape[0]:
                seq.append(text_embed[: codec_embed.shape[0]] + codec_embed)
                trailing = text_embed[codec_embed.shape[0]:]
            else:
                fill = pad.expand(codec_embed.shape[0] - text_embed.shape[0], -1)
                seq.append(torch.cat([text_embed, fill], 0) + codec_embed)
                trailing = pad[None]
        elif non_streaming:
            body = torch.cat([self.talker.embed_text(text_ids), eos[None]], 0)
            seq.append(body + self._codec([tc.codec_pad_id] * body.shape[0]))
            seq.append((pad + self._codec([tc.codec_bos_id])[0])[None])
            trailing = pad[None]
        else:
            seq.append(self.talker.embed_text(text_ids[:1]) + codec_prefix[-1:])
            trailing = torch.cat([self.talker.embed_text(text_ids[1:]), eos[None]], 0)

        prefill = torch.cat(seq, 0)[None]
        return Prompt(prefill=prefill, trailing=trailing, pad_embed=pad, ref_codes=ref_codes, notes=notes)
