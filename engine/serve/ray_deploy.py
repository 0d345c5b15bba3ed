"""`serve --ray`: connect to a Ray cluster (or start one on this machine), deploy one engine replica per GPU
with Ray Serve, and describe the served model from a replica's card, so the front loads no engine itself.

Ray is an optional extra (pip install "ray[serve]"); this module is imported only for --ray.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ..errors import InvalidInputError, UnsupportedConfigError
from .served_model import ServedModel

APP = "qwen3tts"  # the Ray Serve application name; one server per cluster
DEPLOYMENT = "EngineReplica"
INSTALL_HINT = 'serve --ray needs Ray Serve, which this Python lacks: pip install "ray[serve]"'


@dataclass(frozen=True)
class Plan:
    replicas: int
    device: str  # what each replica loads on: "cuda" (the one GPU Ray gives it) or "cpu"
    actor_options: dict


def plan(device: str, replicas: int | None, cluster_gpus: float) -> Plan:
    """How many replicas on what, from --device, --replicas and the cluster's GPUs: one GPU per replica on
    CUDA (auto: CUDA when the cluster has a GPU), one replica per GPU unless --replicas says otherwise."""
    gpus = int(cluster_gpus)
    cuda = device.startswith("cuda") or (device == "auto" and gpus > 0)
    if not cuda:
        return Plan(replicas or 1, "cpu", {})
    if gpus == 0:
        raise UnsupportedConfigError(f"--device {device} with --ray, but the Ray cluster has no GPU; start the "
                                     "Ray nodes on GPU machines, or use --device cpu.")
    count = gpus if replicas is None else replicas
    if count > gpus:
        raise InvalidInputError(f"--replicas {count} asks for more GPUs than the Ray cluster has ({gpus}); each "
                                f"replica holds one GPU. Give --replicas {gpus} or less, or add GPU nodes.")
    return Plan(count, "cuda", {"num_gpus": 1})


def import_ray():
    """Ray and Ray Serve, or ImportError with the install hint."""
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return ray, serve


def connect(address: str | None) -> bool:
    """Join the cluster at `address` ("auto": the one started on this machine by `ray start --head`), or
    start one here when None. True when this process started it (and so stops it at the end)."""
    import logging

    ray, _ = import_ray()
    if ray.is_initialized():
        return False
    if address is not None and ":" in address and "://" not in address:
        _check_reachable(address)
    # "local": a cluster of this process's own, never one that `ray start` left running here
    ray.init(address=address or "local", logging_level=logging.WARNING)
    return address is None


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """ConnectionError at once when nothing listens at HOST:PORT (Ray itself retries for minutes)."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"nothing answers at {address}: {exc}") from None


def _voice_fits(cfg, voice) -> None:
    voice.check_compatible(cfg)


def deploy(model_dir: Path, load: dict, *, replicas: int | None, max_takes: int, max_rows: int, max_queue: int,
           boundary_frames: int, voices_dir: Path | None = None, app: str = APP):
    """Deploy the replicas on the connected cluster as Serve application `app` -> (RayBackend, ServedModel,
    summary). Raises the load error of a replica that could not load the checkpoint (the application is
    removed then)."""
    ray, serve = import_ray()
    from . import ray_board
    from .ray_backend import RayBackend, unwrapped
    from .ray_replica import EngineReplica

    chosen = plan(load["device"], replicas, ray.cluster_resources().get("GPU", 0))
    ongoing = max_rows + max_queue  # a replica takes this many requests; the router queues the rest
    deployment = serve.deployment(EngineReplica, name=DEPLOYMENT, num_replicas=chosen.replicas,
                                  max_ongoing_requests=ongoing,
                                  ray_actor_options=chosen.actor_options,
                                  logging_config={"enable_access_log": False})  # no log line per request
    replica_load = {**load, "device": chosen.device,
                    "codec_dir": None if load.get("codec_dir") is None else str(load["codec_dir"])}
    board_name = f"{app}-board"
    board = ray_board.create(board_name)
    serve.start(proxy_location="Disabled")  # our aiohttp front serves HTTP; Ray's proxy is not needed

    def remove() -> None:
        serve.delete(app)
        ray.kill(board)

    try:
        handle = serve.run(deployment.bind(str(model_dir), replica_load, max_rows, ongoing, boundary_frames,
                                           board_name), name=app, route_prefix=None)
        card = _card(handle, unwrapped)
    except BaseException:
        remove()
        raise
    model = ServedModel(id=card["id"], model_type=card["model_type"], mode=card["mode"], speakers=card["speakers"],
                        languages=card["languages"], max_takes=max_takes, defaults=card["defaults"],
                        check_voice=functools.partial(_voice_fits, card["cfg"]), voices_dir=voices_dir,
                        random_weights=card["random_weights"])
    facts = SimpleNamespace(info=card["info"], config=SimpleNamespace(max_seq_len=card["max_seq_len"]))
    backend = RayBackend(handle, chosen.replicas, max_rows, ongoing, max_queue, board, on_close=remove, engine=facts)
    return backend, model, f"{chosen.replicas} replica(s) on {chosen.device}, each {card['summary']}"


def _card(handle, unwrapped) -> dict:
    """Every replica's card (the first replica's where this Ray Serve cannot ask them all): a replica's load
    error is raised here, before the server listens."""
    broadcast = getattr(handle, "broadcast", None)
    try:
        cards = broadcast("card").results(return_exceptions=True) if broadcast else [handle.card.remote().result()]
    except Exception as exc:  # noqa: BLE001 - each is re-raised, Ray's wrapper taken off
        raise unwrapped(exc) from None
    for card in cards:
        if isinstance(card, BaseException):
            raise unwrapped(card)
    return cards[0]


def disconnect(started_here: bool) -> None:
    """Stop Serve and the cluster this process started; only leave one it joined."""
    ray, serve = import_ray()
    if started_here:
        serve.shutdown()
    ray.shutdown()
