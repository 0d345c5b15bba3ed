"""A speech server (`python -m engine serve`) used as an engine: `RemoteEngine.connect(url, api_key)` offers the
part of the Engine API that the ComfyUI nodes use, over HTTP with the standard library alone."""
from .remote_engine import RemoteConfig, RemoteEngine

__all__ = ["RemoteConfig", "RemoteEngine"]
