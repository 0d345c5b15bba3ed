"""`serve --ray`: the same HTTP front over two engine replicas on a local Ray cluster (CPU, tiny checkpoints),
over real sockets: requests spread over both replicas and equal the in-process server's answers, streaming,
errors, a client that leaves frees its rows on the replica, voices extracted on a replica; and the options'
errors (no Ray installed, more replicas than GPUs)."""
from __future__ import annotations

import base64
import http.client
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.support._q3support import need
from tests.support.serve_thread import ServerThread, wav_samples

LOAD = {"device": "cpu", "dtype": "fp32", "cuda_graphs": "auto", "triton": "auto", "codec_dir": None}
LINE = {"input": "Many engines speak.", "voice": "ryan", "max_new_tokens": 6}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _ray_missing() -> str | None:
    try:
        import ray.serve  # noqa: F401
    except ImportError as exc:
        return f'Ray Serve cannot be imported ({exc}): pip install "ray[serve]"'
    return None


@pytest.fixture(scope="module")
def cluster():
    need(_ray_missing())
    import ray
    from ray import serve

    ray.init(address="local", num_cpus=4, include_dashboard=False, object_store_memory=80 << 20, logging_level="WARNING",
             log_to_driver=False)
    yield ray
    serve.shutdown()
    ray.shutdown()


def _deploy(path, replicas: int, app: str, **kwargs):
    from engine.serve.ray_deploy import deploy

    # the in-process server's rows and boundaries (its Backend's defaults), so both decode alike
    return deploy(path, LOAD, replicas=replicas, app=app, **{"max_takes": 4, "max_rows": 4, "max_queue": 8,
                                                             "boundary_frames": 2, **kwargs})


@pytest.fixture(scope="module")
def custom(cluster, tiny_checkpoints):
    """(the Ray server with two replicas, the in-process server) of the tiny CustomVoice checkpoint."""
    from engine import Engine

    backend, model, _ = _deploy(tiny_checkpoints["custom_voice"], 2, "test-custom")
    remote = ServerThread(backend=backend, model=model)
    local = ServerThread(Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_takes=4))
    yield remote, local
    remote.stop()
    local.stop()


def _ok(server, **fields) -> bytes:
    status, _, data = server.speech(**fields)
    assert status == 200, data[:500]
    return data


def _each(server) -> list:
    status, health = server.json("GET", "/health")
    assert status == 200
    return health["replicas"]["each"]


def _until(server, holds, what: str, within_s: float = 10.0) -> list:
    """Poll /health until `holds(replicas)` (the replicas post their stats every fraction of a second)."""
    deadline = time.monotonic() + within_s
    while not holds(each := _each(server)):
        assert time.monotonic() < deadline, f"{what}: {each}"
        time.sleep(0.1)
    return each


def _idle(each: list) -> bool:
    return not any(r["rows"] or r["running"] or r["waiting"] for r in each)


def test_health_lists_both_replicas_and_the_usual_keys(custom):
    remote, local = custom
    _until(remote, lambda each: len(each) == 2, "not both replicas post their stats")
    _, health = remote.json("GET", "/health")
    _, local_health = local.json("GET", "/health")
    assert set(local_health) <= set(health)
    assert health["model"] == "custom_voice" and health["replicas"]["count"] == 2
    assert len({r["replica"] for r in health["replicas"]["each"]}) == 2
    assert remote.json("GET", "/v1/models")[1]["data"][0]["speakers"] == local.json("GET", "/v1/models")[1]["data"][0][
        "speakers"]
    facts, local_facts = remote.json("GET", "/v1/engine")[1], local.json("GET", "/v1/engine")[1]
    assert (facts["defaults"], facts["max_queue"]) == (local_facts["defaults"], 8)
    same = ("max_seq_len", "model_size", "summary", "device", "dtype", "cuda_graphs", "kernels", "notes")
    assert {k: facts[k] for k in same} == {k: local_facts[k] for k in same}
    assert facts["max_rows"] == 2 * local_facts["max_rows"]  # both replicas' rows


def test_concurrent_requests_use_both_replicas_and_equal_the_local_engine(custom):
    remote, local = custom
    before = sum(r["served"] for r in _each(remote))
    seeds = list(range(8))
    with ThreadPoolExecutor(len(seeds)) as pool:
        answers = list(pool.map(lambda s: _ok(remote, **{**LINE, "max_new_tokens": 12}, seed=s), seeds))
    each = _each(remote)
    assert sum(r["served"] for r in each) - before == len(seeds)
    assert all(r["served"] > 0 for r in each), each  # the router spread the requests
    for seed, answer in zip(seeds, answers):  # the same codes: the samples to one 16-bit step (the codec's batch)
        alone = wav_samples(_ok(local, **{**LINE, "max_new_tokens": 12}, seed=seed)).astype(int)
        got = wav_samples(answer).astype(int)
        assert alone.shape == got.shape and np.abs(got - alone).max() <= 1, f"seed {seed}"
    assert len(set(answers)) == len(seeds)  # the seeds mattered


def test_stream_equals_the_whole_response_and_the_local_stream(custom):
    remote, local = custom
    streamed = _ok(remote, **LINE, seed=5, stream=True)
    assert streamed == _ok(local, **LINE, seed=5, stream=True)
    assert streamed == _ok(remote, **LINE, seed=5, response_format="pcm")


def test_takes_equal_the_local_servers(custom):
    remote, local = custom
    fields = {**LINE, "seed": 5, "takes": 3, "first_take": 2, "response_format": "json"}
    takes = json.loads(_ok(remote, **fields))["takes"]
    assert [t["take"] for t in takes] == [2, 3, 4]
    assert takes == json.loads(_ok(local, **fields))["takes"]


def test_the_remote_engine_client_gets_the_local_servers_results(custom):
    """RemoteEngine (what the nodes use against a server) sends each take as its own request: over both replicas
    they equal the in-process server's: the same codes, the samples to float rounding."""
    from engine import Request
    from engine.remote import RemoteEngine

    remote, local = custom
    request = Request(mode="custom", text=LINE["input"], speaker="ryan")
    got, want = (RemoteEngine.connect(f"http://{s.host}:{s.port}").generate(request, takes=3, seed=4, params=s.model
                 .defaults.capped(6)) for s in (remote, local))
    assert got.lengths == want.lengths and all(g.equal(w) for g, w in zip(got.codes, want.codes))
    assert float((got.audio - want.audio).abs().max()) <= 1e-5  # rows decoded in other batches: float rounding


@pytest.mark.parametrize("fields, param", [({"temperature": -1.0}, "temperature"), ({"voice": "nobody"}, "voice"),
                                           ({"takes": 9, "response_format": "json"}, "takes")])
def test_a_bad_request_gets_the_local_servers_4xx(custom, fields, param):
    remote, local = custom
    status, body = remote.json("POST", "/v1/audio/speech", {**LINE, **fields})
    assert 400 <= status < 500 and body["error"]["param"] == param
    assert (status, body) == local.json("POST", "/v1/audio/speech", {**LINE, **fields})


def test_an_error_raised_on_the_replica_is_the_local_servers_error(custom):
    remote, local = custom
    fields = {**LINE, "input": "word " * 3000, "max_new_tokens": 4}  # longer than the tiny model's cache
    status, body = remote.json("POST", "/v1/audio/speech", fields)
    assert status == 400 and body["error"]["code"] == "PromptTooLongError", body
    assert (status, body) == local.json("POST", "/v1/audio/speech", fields)


def test_a_client_that_leaves_mid_stream_frees_its_rows_on_the_replica(custom):
    remote, _ = custom
    _, before = remote.json("GET", "/health")
    conn = _open_stream(remote, read=True)  # audio flows: the request holds a row
    held = _until(remote, lambda each: any(r["rows"] for r in each), "no replica shows the request's row")
    assert sorted((r["rows"], r["running"]) for r in held) == [(0, 0), (1, 1)]
    conn.close()
    # the whole request (the tiny model's 4096-frame cache) would run about a minute
    _until(remote, _idle, "rows still held after the client left")
    _, after = remote.json("GET", "/health")
    assert after["requests"]["cancelled"] == before["requests"]["cancelled"] + 1
    assert not after["busy"] and after["queued"] == 0


def _open_stream(server, read: bool) -> http.client.HTTPConnection:
    """A streamed request of about a minute; with `read`, once its first audio has come."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", "/v1/audio/speech", json.dumps({**LINE, "stream": True, "max_new_tokens": 100000}),
                 {"Content-Type": "application/json"})
    if read:
        response = conn.getresponse()
        assert response.status == 200 and response.read(1920)
    return conn


def test_past_the_replicas_and_the_queue_a_request_gets_503(cluster, tiny_checkpoints):
    """One replica of one row and a queue of one: it takes two requests (one running, one waiting in its
    scheduler), Ray Serve holds a third, and the fourth gets 503; all of them leave freeing the replica."""
    backend, model, _ = _deploy(tiny_checkpoints["custom_voice"], 1, "test-full", max_takes=1, max_rows=1,
                                max_queue=1)
    server = ServerThread(backend=backend, model=model)
    try:
        held = [_open_stream(server, read=True)]
        held += [_open_stream(server, read=False) for _ in range(2)]
        _until(server, lambda each: each and each[0]["waiting"] == 1, "the second request does not wait")
        assert server.json("GET", "/health")[1]["queued"] == 2  # the second, and the third in Ray Serve's queue
        status, headers, body = server.speech(**LINE)
        assert status == 503 and headers["retry-after"] == "1", body
        assert json.loads(body)["error"]["code"] == "server_busy" and "--max-queue" in body.decode()
        for conn in held:
            conn.close()
        _until(server, _idle, "rows still held after the clients left")
        assert _ok(server, **LINE)  # served again
    finally:
        server.stop()


def _reference_wav() -> bytes:
    import numpy as np

    from engine.audio import wav_bytes

    t = np.arange(2 * 16000) / 16000
    return wav_bytes((0.3 * np.sin(2 * np.pi * (160 + 40 * t) * t)).astype(np.float32), 16000)


def test_voices_travel_with_the_request_and_uploads_are_extracted_on_a_replica(cluster, tiny_checkpoints,
                                                                               tmp_path):
    """A Base checkpoint: a saved voice read by the front and an uploaded reference extracted on the replica
    give the in-process server's audio."""
    from engine import Engine
    from engine.audio import decode_wav
    from engine.voice import Voice

    engine = Engine.load(tiny_checkpoints["base"], device="cpu", dtype="fp32", max_takes=4)
    engine.extract_voice(*decode_wav(_reference_wav()), ref_text="A short reference.").save(
        tmp_path / "calm.safetensors")
    local = ServerThread(engine, voices_dir=tmp_path)
    backend, model, _ = _deploy(tiny_checkpoints["base"], 1, "test-base", voices_dir=tmp_path)
    remote = ServerThread(backend=backend, model=model)
    try:
        line = {"input": "Cloned.", "max_new_tokens": 5, "seed": 2}
        upload = {**line, "reference_audio": base64.b64encode(_reference_wav()).decode(),
                  "reference_text": "A short reference."}
        for fields in ({**line, "voice": "calm"}, upload):
            assert _ok(remote, **fields) == _ok(local, **fields)
        voice = {k: upload[k] for k in ("reference_audio", "reference_text")}
        status, made = remote.json("POST", "/v1/audio/voice", voice)
        expected = local.json("POST", "/v1/audio/voice", voice)[1]
        assert status == 200 and made["icl"] and expected["icl"]
        # the same voice (a file's metadata may list its keys in another order in another process)
        ours, theirs = (Voice.from_bytes(base64.b64decode(v["voice_data"])) for v in (made, expected))
        assert ours.spk_embedding.equal(theirs.spk_embedding) and ours.ref_codes.equal(theirs.ref_codes)
        assert (ours.ref_text, ours.model_size, ours.family) == (theirs.ref_text, theirs.model_size, theirs.family)
        assert _ok(remote, **line, voice_data=made["voice_data"]) == _ok(local, **upload)
        status, body = remote.json("POST", "/v1/audio/speech", {**line, "voice": "missing"})
        assert status == 400 and body["error"]["param"] == "voice" and "calm" in body["error"]["message"]
    finally:
        remote.stop()
        local.stop()


def test_a_replica_that_cannot_load_gives_the_load_error(cluster, tiny_checkpoints):
    from engine.errors import UnsupportedConfigError
    from engine.serve.ray_deploy import deploy

    with pytest.raises(UnsupportedConfigError, match="cuda"):
        deploy(tiny_checkpoints["custom_voice"], {**LOAD, "cuda_graphs": "on"}, replicas=1, max_takes=1,
               max_rows=1, max_queue=1, boundary_frames=2, app="test-bad")


def test_replicas_follow_the_clusters_gpus():
    from engine.errors import InvalidInputError, UnsupportedConfigError
    from engine.serve.ray_deploy import plan

    assert plan("auto", None, 0).device == "cpu" and plan("auto", None, 0).replicas == 1
    gpu = plan("auto", None, 2.0)
    assert (gpu.replicas, gpu.device, gpu.actor_options) == (2, "cuda", {"num_gpus": 1})
    assert plan("cuda:1", 1, 2).replicas == 1
    assert plan("cpu", 3, 8) .replicas == 3 and plan("cpu", 3, 8).actor_options == {}
    with pytest.raises(InvalidInputError, match="--replicas 3 asks for more GPUs than the Ray cluster has \\(2\\)"):
        plan("cuda", 3, 2)
    with pytest.raises(UnsupportedConfigError, match="no GPU"):
        plan("cuda", None, 0)


def test_ray_option_without_ray_says_how_to_install_it(tiny_checkpoints, monkeypatch, capsys):
    from engine.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError, as when it is not installed
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    assert main(["serve", "--model", str(tiny_checkpoints["custom_voice"]), "--ray", "--port", "0"]) == 2
    assert 'pip install "ray[serve]"' in capsys.readouterr().err


def test_ray_options_without_ray_flag_are_refused(tiny_checkpoints, capsys):
    from engine.cli import main

    assert main(["serve", "--model", str(tiny_checkpoints["custom_voice"]), "--replicas", "2"]) == 2
    assert "--replicas applies to --ray only" in capsys.readouterr().err
