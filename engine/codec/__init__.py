"""The 12 Hz speech tokenizer (codec): config, encoder, decoder, container."""
from .config import CodecConfig, DecoderConfig
from .decoder import CodecDecoder, DecodeState
from .model import SpeechTokenizer

__all__ = ["CodecConfig", "CodecDecoder", "DecodeState", "DecoderConfig", "SpeechTokenizer"]
