"""What can go wrong talking to a speech server, as typed errors whose messages say what to do. Each is a
Qwen3TTSError, so callers that handle the engine's errors handle these too."""
from __future__ import annotations

from ..errors import InvalidInputError, QueueFullError, Qwen3TTSError

START_HINT = ("start it on the GPU machine with `python -m engine serve --model <checkpoint folder> --host 0.0.0.0 "
              "--port 8000 --api-key <key>` (docs/SERVER.md)")


class RemoteError(Qwen3TTSError):
    """The speech server could not serve a request."""


class ServerUnreachableError(RemoteError, ConnectionError):
    def __init__(self, url: str, reason: str):
        super().__init__(f"cannot reach the speech server at {url} ({reason}). Check the URL and port, and that the "
                         f"server runs: {START_HINT}; a firewall must let the port through.")


class ServerAuthError(RemoteError):
    def __init__(self, url: str, message: str):
        super().__init__(f"the speech server at {url} refused the API key ({message}). Give the key the server was "
                         "started with (its --api-key, or QWEN3TTS_API_KEY) as api_key.")


class ServerRequestError(RemoteError, InvalidInputError):
    """The server refused a request (4xx); `param` names the request field, `code` the server's error code."""

    def __init__(self, url: str, status: int, message: str, param: str | None = None, code: str | None = None):
        where = f" (field '{param}')" if param else ""
        super().__init__(f"the speech server at {url} refused the request{where}: {message}")
        self.status, self.param, self.code = status, param, code


class ServerBusyError(RemoteError, QueueFullError):
    def __init__(self, url: str, message: str):
        super().__init__(f"the speech server at {url} is full ({message}). Run again in a moment, or start the "
                         "server with a larger --max-queue.")


class ServerFailedError(RemoteError, RuntimeError):
    def __init__(self, url: str, status: int, message: str):
        super().__init__(f"the speech server at {url} failed (HTTP {status}: {message}). Its log says why; run "
                         "again, and report it with the server's log if it repeats.")


class ServerProtocolError(RemoteError, RuntimeError):
    def __init__(self, url: str, what: str):
        super().__init__(f"the answer from {url} is not a Qwen3-TTS speech server's ({what}). Check that the URL "
                         f"points at `python -m engine serve` of this version; {START_HINT}.")
