"""A POST /v1/audio/speech body, checked field by field, as the engine call it asks for.

Every error is a FieldError naming the field, raised before any work reaches the engine. The fields are
OpenAI's (model, input, voice, response_format, speed, stream), ours (language, instructions, seed, takes,
first_take, reference_audio, reference_text, voice_data, sample_format, chunk_frames, first_chunk_frames) and the
sampling overrides under SamplingParams' own names.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import importlib.util
from dataclasses import dataclass

from .. import checks
from ..errors import InvalidInputError, VoiceError
from ..limits import SEED_MAX, TAKE_STREAMS
from ..prompt import Request
from ..sampling import MAX_NEW_TOKENS, SamplingParams
from ..voice import Voice
from .api_errors import FieldError
from .served_model import ServedModel

OPENAI_FIELDS = ("model", "input", "voice", "response_format", "speed", "stream")
OWN_FIELDS = ("language", "instructions", "seed", "takes", "first_take", "reference_audio", "reference_text",
              "voice_data", "sample_format", "chunk_frames", "first_chunk_frames")
SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))
FIELDS = OPENAI_FIELDS + OWN_FIELDS + SAMPLING_FIELDS
AUDIO_FORMATS = ("wav", "flac", "pcm")  # one take as audio
FORMATS = AUDIO_FORMATS + ("json",)  # json: every take as base64 WAV
SAMPLE_FORMATS = ("s16", "f32")  # f32: pcm and json carry the engine's float samples exactly (little-endian)


@dataclass
class Speech:
    request: Request  # for a reference upload, its voice is extracted by the server before the engine call
    takes: int
    seed: int
    first_take: int
    params: SamplingParams
    response_format: str
    stream: bool
    reference: tuple | None = None  # (waveform [C, T] float32, sample rate) of an uploaded reference
    reference_text: str | None = None
    sample_format: str = "s16"
    chunk_frames: int | None = None  # a stream's chunking; None: the server's
    first_chunk_frames: int | None = None


def flac_available() -> bool:
    return importlib.util.find_spec("soundfile") is not None


def _checked(param: str, check, *args, **kwargs):
    """check(...) with its InvalidInputError as a FieldError naming `param`."""
    try:
        return check(*args, **kwargs)
    except InvalidInputError as exc:
        raise FieldError(param, str(exc)) from None


def _get(body: dict, name: str, default):
    """A field's value; null counts as left out."""
    value = body.get(name)
    return default if value is None else value


def text_field(body: dict, name: str, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None and required:
        raise FieldError(name, f"{name} is required.")
    return _checked(name, checks.text_value, name, value, optional=not required)


def parse(body, model: ServedModel) -> Speech:
    if not isinstance(body, dict):
        raise FieldError(None, f"the request body must be a JSON object, not {type(body).__name__}.")
    for name in body:
        if name not in FIELDS:
            raise FieldError(name, f"unknown field '{name}'. The fields are: {', '.join(FIELDS)}.")

    name = text_field(body, "model")
    if name is not None and name != model.id:
        raise FieldError("model", f"this server serves model '{model.id}', not '{name}' (GET /v1/models lists it).",
                         status=404, code="model_not_found")
    text = text_field(body, "input", required=True)
    if not text.strip():
        raise FieldError("input", "input is empty; give the text to speak.")

    stream = False if body.get("stream") is None else _checked("stream", checks.flag, "stream", body["stream"])
    fmt = _response_format(body, stream)
    speed = body.get("speed")
    if speed is not None:
        _checked("speed", checks.real_number, "speed", speed, 0.0, 100.0, lo_open=True)
        if float(speed) != 1.0:
            raise FieldError("speed", f"speed must be 1.0 (got {speed!r}): the model has no speed control. Ask for "
                                      "a slower or faster pace in instructions (1.7B CustomVoice and VoiceDesign), or "
                                      "resample the audio.")

    takes = _checked("takes", checks.whole_number, "takes", _get(body, "takes", 1), 1, model.max_takes,
                     f"The server was started with --max-takes {model.max_takes}.")
    if takes > 1 and stream:
        raise FieldError("takes", f"a stream carries one take (got takes {takes}); ask for takes 1, with first_take "
                                  "to pick which, or for response_format json without stream to get them all.")
    if takes > 1 and fmt != "json":
        raise FieldError("takes", f"takes {takes} needs response_format json (each take as base64 WAV): an audio "
                                  "response holds one take. Ask for json, or for takes 1 with first_take to pick one.")
    seed = _checked("seed", checks.whole_number, "seed", _get(body, "seed", 0), 0, SEED_MAX)
    last = TAKE_STREAMS - takes
    first_take = _checked("first_take", checks.whole_number, "first_take", _get(body, "first_take", 0), 0, last)

    language = text_field(body, "language") or "auto"
    if language.strip().lower() not in [x.lower() for x in model.languages]:
        raise FieldError("language", f"unknown language '{language}'. Choose one of: "
                                     f"{', '.join(x.capitalize() for x in model.languages)}.")
    instructions = text_field(body, "instructions")
    if instructions is not None and model.mode == "clone":
        raise FieldError("instructions", "instructions do not apply to a Base checkpoint (voice cloning); leave "
                                         "the field out.")

    speech = Speech(request=Request(mode=model.mode, text=text, language=language, instruct=instructions),
                    takes=takes, seed=seed, first_take=first_take, params=_params(body, model), response_format=fmt,
                    stream=stream)
    _transport(body, speech)
    _voice(body, model, speech)
    return speech


def _response_format(body: dict, stream: bool) -> str:
    fmt = body.get("response_format")
    if fmt is None:
        return "pcm" if stream else "wav"
    fmt = _checked("response_format", checks.text_value, "response_format", fmt)
    if fmt not in FORMATS:
        raise FieldError("response_format", f"response_format '{fmt}' is not served; use one of "
                                            f"{', '.join(FORMATS)}.")
    if stream and fmt != "pcm":
        raise FieldError("response_format", f"stream true sends raw PCM (16-bit, 24 kHz, mono) as it is made; set "
                                            f"response_format to pcm or leave it out (got {fmt}).")
    if fmt == "flac" and not flac_available():
        raise FieldError("response_format", "response_format flac needs the soundfile package, which this server's "
                                            "Python lacks: pip install soundfile, then restart the server. Or ask "
                                            "for wav.")
    return fmt


def _transport(body: dict, speech: Speech) -> None:
    """How the audio travels: its sample format and, for a stream, its chunking."""
    sample_format = text_field(body, "sample_format") or "s16"
    if sample_format not in SAMPLE_FORMATS:
        raise FieldError("sample_format", f"sample_format '{sample_format}' is not served; use s16 (16-bit) or f32 "
                                          "(the engine's float samples).")
    if sample_format == "f32" and speech.response_format not in ("pcm", "json"):
        raise FieldError("sample_format", f"sample_format f32 is for response_format pcm or json, not "
                                          f"{speech.response_format}; WAV and FLAC carry 16-bit samples.")
    speech.sample_format = sample_format
    for name in ("chunk_frames", "first_chunk_frames"):
        if body.get(name) is not None and not speech.stream:
            raise FieldError(name, f"{name} shapes a stream's chunks; send it with stream true, or leave it out.")
    if body.get("chunk_frames") is not None:
        speech.chunk_frames = _checked("chunk_frames", checks.whole_number, "chunk_frames", body["chunk_frames"], 1,
                                       MAX_NEW_TOKENS, "8 frames (0.64 s) is typical.")
    if body.get("first_chunk_frames") is not None:
        speech.first_chunk_frames = _checked("first_chunk_frames", checks.whole_number, "first_chunk_frames",
                                             body["first_chunk_frames"], 0, speech.chunk_frames or MAX_NEW_TOKENS,
                                             "0 makes the first chunk as long as the others.")


def _params(body: dict, model: ServedModel) -> SamplingParams:
    """The checkpoint's sampling settings with the request's overrides, checked by SamplingParams.validate."""
    given = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    params = model.defaults
    if "max_new_tokens" in given:
        budget = _checked("max_new_tokens", checks.integer, "max_new_tokens", given.pop("max_new_tokens"))
        params = params.capped(budget)  # lowers the checkpoint's min_new_tokens with it (validate checks range)
    try:
        return params.replace(**given).validate()
    except InvalidInputError as exc:
        field = str(exc).split(" ", 1)[0]  # validate's messages start with the field's name
        raise FieldError(field if field in SAMPLING_FIELDS else None, str(exc)) from None


def _voice(body: dict, model: ServedModel, speech: Speech) -> None:
    """Fill in the voice: a preset speaker (CustomVoice), a saved voice or an uploaded reference (Base)."""
    voice = text_field(body, "voice")
    upload, ref_text = body.get("reference_audio"), text_field(body, "reference_text")
    if model.mode != "clone":
        for name in ("reference_audio", "reference_text", "voice_data"):
            if body.get(name) is not None:
                raise FieldError(name, f"{name} is for Base checkpoints (voice cloning); this server's model is "
                                       f"{model.model_type}. Leave the field out.")
    if model.mode == "custom":
        if not voice or voice.strip().lower() not in [s.lower() for s in model.speakers]:
            what = "voice is required" if not voice else f"unknown voice '{voice}'"
            raise FieldError("voice", f"{what}: choose one of this model's speakers: {', '.join(model.speakers)}.")
        speech.request.speaker = voice.strip().lower()
        return
    if model.mode == "design":
        return  # VoiceDesign describes the voice in `instructions`; `voice` is ignored (OpenAI clients must send one)
    if body.get("voice_data") is not None:
        given = [name for name in ("voice", "reference_audio", "reference_text") if body.get(name)]
        if given:
            raise FieldError(given[0], f"give either voice_data (a voice as data) or {given[0]}, not both.")
        speech.request.voice = _voice_data(body["voice_data"], model)
        return
    if upload is not None:
        if voice:
            raise FieldError("voice", "give either voice (a saved voice) or reference_audio, not both; with the "
                                      "OpenAI client, which requires voice, pass voice=\"\".")
        speech.reference = reference_upload(upload)
        speech.reference_text = ref_text if ref_text and ref_text.strip() else None
        return
    if ref_text is not None:
        raise FieldError("reference_text", "reference_text is the transcript of reference_audio; send the audio "
                                           "too, or leave the field out.")
    if not voice:
        raise FieldError("voice", "a Base checkpoint needs a voice: the name of a saved voice "
                                  f"({', '.join(model.saved_voices()) or 'none saved'}), or reference_audio with its "
                                  "reference_text.")
    try:
        speech.request.voice = model.saved_voice(voice)
    except VoiceError as exc:
        raise FieldError("voice", str(exc)) from None


def _base64_field(name: str, text, what: str, hint: str) -> bytes:
    """The bytes a base64 field carries, or the field's error: `what` the file it must hold, `hint` the fix."""
    if not isinstance(text, str):
        raise FieldError(name, f"{name} must be a string: {what} in base64.")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise FieldError(name, f"{name} is not valid base64; {hint}") from None


def _voice_data(data, model: ServedModel):
    """voice_data: base64 of a voice file (what SaveVoice writes), checked against the served model."""

    raw = _base64_field("voice_data", data, "a voice file (.safetensors)", "send the voice file's bytes base64-encoded.")
    try:
        voice = Voice.from_bytes(raw, "voice_data")
        model.check_voice(voice)
    except VoiceError as exc:
        raise FieldError("voice_data", str(exc)) from None
    return voice


def reference_upload(upload) -> tuple:
    """An uploaded reference, base64 of a WAV file (other formats with soundfile), as (waveform [C, T], rate)."""
    from .. import audio

    if isinstance(upload, str) and upload.startswith("data:") and "," in upload:  # data:audio/wav;base64,....
        upload = upload.split(",", 1)[1]
    data = _base64_field("reference_audio", upload, "a WAV file", "send the file's bytes base64-encoded (e.g. "
                         "base64.b64encode(open(path, 'rb').read())).")
    try:
        if data[:4] in (b"RIFF", b"RF64") or not flac_available():
            waveform, rate = audio.decode_wav(data, "reference_audio")
        else:
            waveform, rate = _decode_other(data)
        audio.validate_reference(waveform, rate)
    except InvalidInputError as exc:
        raise FieldError("reference_audio", str(exc)) from None
    return waveform, rate


def _decode_other(data: bytes) -> tuple:
    import io

    import soundfile

    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (RuntimeError, TypeError, ValueError) as exc:  # soundfile's LibsndfileError is a RuntimeError
        raise InvalidInputError(f"reference_audio is not an audio file soundfile can read ({exc}); send WAV, "
                                "FLAC or OGG.") from None
    return samples.T.copy(), rate
