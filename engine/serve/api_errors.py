"""Errors as the API returns them: `{"error": {"message", "type", "param", "code"}}` (OpenAI's shape), and the
status and body of each exception a request can end with."""
from __future__ import annotations

from ..errors import EngineBusyError, QueueFullError, Qwen3TTSError


class FieldError(Exception):
    """A request field is missing or unusable; `param` names it (None: the request as a whole)."""

    def __init__(self, param: str | None, message: str, status: int = 400, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.param, self.message, self.status, self.kind, self.code = param, message, status, kind, code


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def status_and_body(exc: Exception) -> tuple[int, dict]:
    """The response to a request that raised `exc`: its own status for a FieldError, 503 while the server is
    full, 400 with the engine's message for an error the request caused, else 500."""
    if isinstance(exc, FieldError):
        return exc.status, error_body(exc.message, exc.kind, exc.param, exc.code)
    if isinstance(exc, (QueueFullError, EngineBusyError)):
        return 503, error_body(str(exc), "server_busy", code="server_busy")
    if isinstance(exc, Qwen3TTSError):
        return 400, error_body(str(exc), "invalid_request_error", code=type(exc).__name__)
    return 500, error_body(f"internal error ({type(exc).__name__}: {exc}); the server is still running. If it "
                           "happens again with this request, report it with the server's log.", "server_error")
