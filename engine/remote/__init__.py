"""A speech server (`python -m engine serve`) used as an engine: `RemoteEngine.connect(url, api_key)` offers the
part of the Engine API that the ComfyUI nodes use, over HTTP with the standard library alone."""
from .config import RemoteConfig


def __getattr__(name):  # RemoteEngine pulls in torch and the engine: only when it is used
    if name == "RemoteEngine":
        from .remote_engine import RemoteEngine

        return RemoteEngine
    raise AttributeError(name)


__all__ = ["RemoteConfig", "RemoteEngine"]
