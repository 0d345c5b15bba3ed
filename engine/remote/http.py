"""HTTP to the speech server with the standard library: one connection per call, so calls run side by side on
threads, and any of them can be cut off from another thread (closing its socket is how the server learns that
the client left, and frees the request's rows)."""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse

from ..errors import GenerationInterrupted, InvalidInputError
from .errors import (
    ServerAuthError,
    ServerBusyError,
    ServerFailedError,
    ServerProtocolError,
    ServerRequestError,
    ServerUnreachableError,
)

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 900.0  # one request's whole audio, or the gap between two chunks of a stream
BUSY_RETRIES = 5  # a full queue (503) is asked again this many times, Retry-After apart, before it is an error


def parse_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path prefix) of `http[s]://host[:port][/prefix]`; a bare host:port means http."""
    text = (url or "").strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 or parts.query or parts.fragment:
        raise InvalidInputError(f"server {url!r} is not a server URL; give http://HOST:PORT, e.g. "
                                "http://192.168.1.20:8000 (what `python -m engine serve` prints).")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), parts.path.rstrip("/")


class Group:
    """The calls of one engine call: `cancel()` (any thread) cuts every open one off and refuses new ones."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open: set = set()
        self.cancelled = False

    def add(self, call) -> None:
        with self._lock:
            if self.cancelled:
                raise GenerationInterrupted("cancelled")
            self._open.add(call)

    def discard(self, call) -> None:
        with self._lock:
            self._open.discard(call)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            calls = list(self._open)
        for call in calls:
            call.abort()


class Call:
    """One request and its response: read() its body; abort() from any thread."""

    def __init__(self, conn: http.client.HTTPConnection, group: Group | None):
        self.conn, self.group, self.response = conn, group, None

    def read(self, n: int | None = None) -> bytes:
        try:
            return self.response.read() if n is None else self.response.read(n)
        except (OSError, http.client.HTTPException) as exc:
            if self.group is not None and self.group.cancelled:
                raise GenerationInterrupted("cancelled") from None
            raise ServerUnreachableError(self.conn.url, f"the connection broke mid-answer: {exc}") from None

    def abort(self) -> None:
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self.group is not None:
            self.group.discard(self)
        self.conn.close()


class Server:
    def __init__(self, url: str, api_key: str | None = None):
        self.scheme, self.host, self.port, self.prefix = parse_url(url)
        self.url = f"{self.scheme}://{self.host}:{self.port}{self.prefix}"
        self.api_key = api_key.strip() if api_key and api_key.strip() else None

    def _connection(self) -> http.client.HTTPConnection:
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=CONNECT_TIMEOUT_S,
                                               context=ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=CONNECT_TIMEOUT_S)
        conn.url = self.url
        return conn

    def open(self, method: str, path: str, body: dict | None = None, group: Group | None = None,
             should_stop=None) -> Call:
        """Send a request; return the Call once a 2xx status came, else raise the error its answer describes.
        A 503 (the server's queue is full) is asked again a few times first."""
        for attempt in range(BUSY_RETRIES + 1):
            try:
                return self._open_once(method, path, body, group)
            except ServerBusyError as exc:
                if attempt == BUSY_RETRIES:
                    raise
                wait = max(getattr(exc, "retry_after", 1.0), 0.2)
                end = time.monotonic() + wait
                while time.monotonic() < end:
                    if (group is not None and group.cancelled) or (should_stop is not None and should_stop()):
                        raise GenerationInterrupted("cancelled") from None
                    time.sleep(0.05)
        raise AssertionError("unreachable")

    def _open_once(self, method: str, path: str, body: dict | None, group: Group | None) -> Call:
        conn = self._connection()
        call = Call(conn, group)
        if group is not None:
            group.add(call)
        headers = {"Accept": "application/json, audio/*"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.connect()
            if group is not None and group.cancelled:  # cancelled while connecting: abort() saw no socket yet
                call.close()
                raise GenerationInterrupted("cancelled")
            conn.sock.settimeout(READ_TIMEOUT_S)
            conn.request(method, self.prefix + path, body=data, headers=headers)
            call.response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            call.close()
            if group is not None and group.cancelled:
                raise GenerationInterrupted("cancelled") from None
            raise ServerUnreachableError(self.url, _reason(exc)) from None
        if 200 <= call.response.status < 300:
            return call
        try:
            raw = call.read()
        finally:
            call.close()
        raise _error(self.url, call.response, raw)

    def json(self, method: str, path: str, body: dict | None = None, group: Group | None = None) -> dict:
        call = self.open(method, path, body, group)
        try:
            raw = call.read()
        finally:
            call.close()
        try:
            return json.loads(raw)
        except ValueError:
            raise ServerProtocolError(self.url, f"{method} {path} did not answer JSON") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused: nothing listens on that port"
    if isinstance(exc, socket.gaierror):
        return f"the host name is unknown: {exc.strerror or exc}"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "no answer in time"
    return f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"


def _error(url: str, response, raw: bytes) -> Exception:
    """The typed error an error answer stands for."""
    try:
        err = json.loads(raw)["error"]
        message, param, code = str(err.get("message")), err.get("param"), err.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, param, code = (raw[:200].decode("utf-8", "replace").strip() or response.reason), None, None
    status = response.status
    if status == 401:
        return ServerAuthError(url, message)
    if status == 503:
        exc = ServerBusyError(url, message)
        try:
            exc.retry_after = float(response.getheader("Retry-After") or 1)
        except ValueError:
            exc.retry_after = 1.0
        return exc
    if status == 404 and code is None and param is None and "endpoints" in message:
        return ServerProtocolError(url, f"it lacks an endpoint this client needs: {message}")
    if 400 <= status < 500:
        return ServerRequestError(url, status, message, param, code)
    return ServerFailedError(url, status, message)
