"""RemoteEngine against a real server on tiny random checkpoints (CPU, real sockets): the same seed gives the same
audio as the local engine for takes, lists, streams and voices; every server error is a typed error that says
what to do; stopping cuts the requests off and the server serves the next."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from engine import BatchItem, Request
from engine.errors import GenerationInterrupted, InvalidInputError
from engine.remote import RemoteEngine
from engine.remote.errors import (
    ServerAuthError,
    ServerBusyError,
    ServerRequestError,
    ServerUnreachableError,
)
from tests.support.serve_thread import ServerThread

KEY = "remote-key-42"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _engine(path):
    from engine import Engine

    return Engine.load(path, device="cpu", dtype="fp32", max_takes=4)


def _reference():
    t = np.arange(2 * 16000) / 16000
    return torch.from_numpy((0.3 * np.sin(2 * np.pi * (160 + 40 * t) * t)).astype(np.float32))[None], 16000


@pytest.fixture(scope="module")
def custom(tiny_checkpoints):
    server = ServerThread(_engine(tiny_checkpoints["custom_voice"]), api_key=KEY, max_queue=2)
    yield server, RemoteEngine.connect(f"http://{server.host}:{server.port}", KEY)
    server.stop()


@pytest.fixture(scope="module")
def base(tiny_checkpoints):
    server = ServerThread(_engine(tiny_checkpoints["base"]))
    yield server, RemoteEngine.connect(f"http://{server.host}:{server.port}")
    server.stop()


def _line(text="Remote and local agree.", speaker="ryan"):
    return Request(mode="custom", text=text, language="English", speaker=speaker)


def test_facts_are_the_servers_engines(custom):
    server, remote = custom
    local = server.engine
    assert (remote.model_type, remote.speakers, remote.languages, remote.defaults, remote.sample_rate) == \
        (local.model_type, local.speakers, local.languages, local.defaults, local.sample_rate)
    assert remote.max_takes == 4 and remote.config.max_seq_len == local.config.max_seq_len
    assert "custom_voice" in remote.info.summary() and remote.config.url in remote.info.summary()
    assert "remote-key" not in repr(remote.config)  # the key never shows in logs


def _same(got, want):
    """The same codes, and the same audio within the float rounding of a codec that decodes rows together (the
    local batch) or one by one (the server's separate requests)."""
    assert got.lengths == want.lengths and len(got.codes) == len(want.codes)
    assert all(torch.equal(g, w) for g, w in zip(got.codes, want.codes))
    assert torch.allclose(got.audio, want.audio, atol=1e-5), (got.audio - want.audio).abs().max()


def test_takes_and_lists_equal_the_local_engine(custom):
    server, remote = custom
    params = remote.defaults.replace(temperature=0.7, max_new_tokens=5)
    want = server.engine.generate(_line(), takes=3, seed=11, first_take=1, params=params)
    got = remote.generate(_line(), takes=3, seed=11, first_take=1, params=params)
    _same(got, want)
    items = [BatchItem(_line("First piece."), seed=3), BatchItem(_line("Second, longer piece.", "vivian"), takes=2,
                                                                 seed=4, max_new_tokens=4)]
    progress = []
    results = remote.generate(items, params=params, on_progress=lambda d, t: progress.append((d, t)))
    for r, w in zip(results, server.engine.generate(items, params=params)):
        _same(r, w)
    assert progress and progress[-1][0] == sum(n // 1920 for r in results for n in r.lengths)


def test_items_and_takes_run_side_by_side_on_the_servers_rows(custom):
    """Each take of each item is its own request, and the requests are open together: the server's scheduler
    decodes them in the same loop, as many at once as the client keeps open (its --max-queue, 2, here)."""
    server, remote = custom
    seen = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen.append(server.backend.stats()["running"])
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        remote.generate([BatchItem(_line("One line."), takes=2, seed=1), BatchItem(_line("Another."), seed=2)],
                        params=remote.defaults.replace(max_new_tokens=60))
    finally:
        done.set()
        watcher.join()
    assert max(seen) == remote.in_flight == 2


def test_a_stream_equals_the_local_stream(custom):
    server, remote = custom
    params = remote.defaults.replace(max_new_tokens=7)
    items = [BatchItem(_line("Streamed piece one."), seed=5), BatchItem(_line("And piece two."), seed=6)]

    def joined(engine):
        parts = {0: [], 1: []}
        finals = []
        for c in engine.stream(items, params=params, chunk_frames=3, first_chunk_frames=2):
            parts[c.item].append(c.audio)
            finals += [c.item] if c.final else []
        return [torch.cat(parts[k]) for k in (0, 1)], sorted(finals)

    (want, want_finals), (got, got_finals) = joined(server.engine), joined(remote)
    assert got_finals == want_finals == [0, 1]
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.allclose(g, w, atol=1e-5)


def test_voices_and_clones_equal_the_local_engine(base):
    server, remote = base
    wav, sr = _reference()
    for ref_text in ("A short reference.", None):
        got, want = remote.extract_voice(wav, sr, ref_text=ref_text), server.engine.extract_voice(wav, sr, ref_text)
        assert torch.equal(got.spk_embedding, want.spk_embedding) and got.ref_text == want.ref_text
        assert (got.ref_codes is None) == (want.ref_codes is None)
        assert got.ref_codes is None or torch.equal(got.ref_codes, want.ref_codes)
        req = Request(mode="clone", text="Cloned far away.", language="English", voice=got)
        params = remote.defaults.replace(max_new_tokens=4)
        _same(remote.generate(req, takes=2, seed=9, params=params),
              server.engine.generate(req, takes=2, seed=9, params=params))


def test_a_refused_field_is_a_typed_error_naming_it(custom, base):
    _, remote = custom
    with pytest.raises(ServerRequestError) as err:
        remote.generate(_line(speaker="nobody"), params=remote.defaults.replace(max_new_tokens=3))
    assert err.value.param == "voice" and "nobody" in str(err.value) and remote.config.url in str(err.value)
    _, base_remote = base
    wav, _ = _reference()
    with pytest.raises(ServerRequestError) as err:
        base_remote.extract_voice(wav[:, :4000], 16000, "Too short.")
    assert err.value.param == "reference_audio" and "shorter than" in str(err.value)
    with pytest.raises(InvalidInputError):  # a ServerRequestError is the engine's InvalidInputError as well
        base_remote.extract_voice(wav, 16000, "\u200b")
    for what, kwargs in ((_line(), {"takes": 5}), ([BatchItem(_line(), takes=0)], {})):
        with pytest.raises(InvalidInputError, match="takes must be between 1 and 4.*--max-takes"):
            remote.generate(what, **kwargs)  # refused before any request


def test_a_wrong_key_names_the_api_key(custom):
    server, _ = custom
    for key in (None, "wrong"):
        with pytest.raises(ServerAuthError, match="api_key"):
            RemoteEngine.connect(f"http://{server.host}:{server.port}", key)


def test_an_unreachable_server_names_the_url_and_how_to_start_it():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free now, and nothing listens on it
    with pytest.raises(ServerUnreachableError) as err:
        RemoteEngine.connect(f"http://127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in str(err.value) and "python -m engine serve" in str(err.value)
    with pytest.raises(InvalidInputError, match="http://HOST:PORT"):
        RemoteEngine.connect("ftp://somewhere")


def test_a_full_queue_is_retried_then_a_typed_error(custom, monkeypatch):
    """The server lets 2 requests wait. A client keeps at most 2 open, so alone it is never refused; 12 at once (as
    from several clients) overflow it: with retries off the overflow is a ServerBusyError saying to run again,
    with them on every request gets through."""
    from engine.remote import http

    _, remote = custom
    params = remote.defaults.replace(max_new_tokens=40)
    items = [BatchItem(_line(f"Line number {k}."), seed=k) for k in range(12)]
    monkeypatch.setattr(http, "BUSY_RETRIES", 0)
    assert remote.in_flight == 2 and len(remote.generate(items[:6], params=params)) == 6
    monkeypatch.setattr(remote, "in_flight", 12)
    with pytest.raises(ServerBusyError, match="Run again"):
        remote.generate(items, params=params)
    monkeypatch.setattr(http, "BUSY_RETRIES", 50)
    monkeypatch.setattr(http.ServerBusyError, "retry_after", 0.05, raising=False)
    assert len(remote.generate(items, params=params)) == 12


@pytest.mark.parametrize("how", ["generate", "stream"])
def test_should_stop_cuts_the_requests_off_and_the_server_serves_the_next(custom, how):
    server, remote = custom
    params = remote.defaults.replace(max_new_tokens=2000)  # far longer than the test waits
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    t0 = time.perf_counter()
    with pytest.raises(GenerationInterrupted):
        if how == "generate":
            remote.generate(_line(), takes=2, params=params, should_stop=stop.is_set)
        else:
            for _ in remote.stream(_line(), params=params, chunk_frames=2, should_stop=stop.is_set):
                pass
    assert time.perf_counter() - t0 < 30
    deadline = time.time() + 30
    while server.backend.stats()["running"] and time.time() < deadline:  # the server saw the client leave
        time.sleep(0.05)
    assert not server.backend.stats()["running"]
    assert remote.generate(_line(), params=remote.defaults.replace(max_new_tokens=2)).lengths == [2 * 1920]


def test_a_server_failure_and_a_server_of_another_kind_are_typed_errors(custom, monkeypatch):
    """A 500 (the engine failed unexpectedly) is a ServerFailedError pointing at the server's log; an HTTP server
    that is not this one is a ServerProtocolError saying so."""
    import http.server

    from engine.remote.errors import ServerFailedError, ServerProtocolError

    server, remote = custom

    async def broken(*args, **kwargs):
        raise RuntimeError("a broken backend")

    monkeypatch.setattr(server.backend, "submit", broken)
    with pytest.raises(ServerFailedError, match="server's log"):
        remote.generate(_line(), params=remote.defaults.replace(max_new_tokens=2))
    monkeypatch.undo()

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # the stdlib calls it by this name
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>a web page</html>")

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ServerProtocolError, match="not a Qwen3-TTS speech server"):
            RemoteEngine.connect(f"http://127.0.0.1:{other.server_address[1]}")
    finally:
        other.shutdown()
