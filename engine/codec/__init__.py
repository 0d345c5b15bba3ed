"""The 12 Hz speech tokenizer (codec): config, decoder, streaming decode, container."""
from .config import CodecConfig, DecoderConfig
from .decoder import CodecDecoder, DecodeState
from .model import SpeechTokenizer
from .streaming import StreamingDecoder

__all__ = ["CodecConfig", "CodecDecoder", "DecodeState", "DecoderConfig", "SpeechTokenizer", "StreamingDecoder"]
