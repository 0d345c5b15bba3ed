"""`python -m engine serve`: check the options, load the checkpoint once, then serve until stopped (Ctrl-C or
SIGTERM)."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import sys


def serve(args) -> int:
    from ..cli import check_load_args, load_options, note_random_weights
    from ..engine import Engine
    from ..errors import Qwen3TTSError
    from .options import check_serve_args

    try:
        check_load_args(args)
        check_serve_args(args)
        import aiohttp  # noqa: F401 - checked before the load, so a missing package costs no load time
    except Qwen3TTSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ImportError:
        print("error: the server needs aiohttp (ComfyUI installs it): pip install aiohttp", file=sys.stderr)
        return 2
    if args.ray:
        return _serve_ray(args)
    note_random_weights(args.model)
    try:
        engine = Engine.load(args.model, max_takes=args.max_rows, warm_takes=args.max_rows, **load_options(args))
    except Qwen3TTSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def local():
        from .backend import Backend
        from .served_model import ServedModel

        return (Backend(engine, max_queue=args.max_queue, max_rows=args.max_rows,
                        boundary_frames=args.boundary_frames),
                ServedModel.of(engine, args.max_takes, args.voices), engine.info.summary())

    return _serve_until_stopped(local, args)


def _serve_until_stopped(make_backend, args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_run(make_backend, args))
    except OSError as exc:  # the port is taken, the address is not this machine's, ...
        print(f"error: cannot listen on {args.host}:{args.port} ({exc.strerror or exc}); choose another --port or "
              "--host.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _serve_ray(args) -> int:
    """The same front over engine replicas on Ray Serve (engine/serve/ray_deploy.py)."""
    from ..cli import load_options, note_random_weights
    from ..errors import Qwen3TTSError

    try:
        from .ray_deploy import connect, deploy, disconnect, import_ray

        import_ray()
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    note_random_weights(args.model)
    try:
        started_here = connect(args.ray_address)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        print(f"error: cannot join the Ray cluster at {args.ray_address} ({exc}); {_join_hint(exc)}", file=sys.stderr)
        return 2
    try:
        try:
            parts = deploy(args.model, load_options(args), replicas=args.replicas, max_takes=args.max_takes,
                           max_rows=args.max_rows, max_queue=args.max_queue, boundary_frames=args.boundary_frames,
                           voices_dir=args.voices)
        except Qwen3TTSError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except RuntimeError as exc:  # Ray Serve could not start the replicas (it names the failure)
            print(f"error: the engine replicas did not start on Ray Serve: {exc}", file=sys.stderr)
            return 1
        return _serve_until_stopped(lambda: parts, args)
    finally:
        disconnect(started_here)


def _join_hint(exc: BaseException) -> str:
    """What to do when ray.init cannot join the cluster: the cluster's auth token, when that was refused."""
    causes = []
    while exc is not None:
        causes.append(str(exc))
        exc = exc.__cause__
    if any("InvalidAuthToken" in c or "AuthenticationError" in c for c in causes):
        return ("the cluster wants its authentication token: run with RAY_AUTH_MODE=token and the token of "
                "`ray get-auth-token` (on the head) in ~/.ray/auth_token or the RAY_AUTH_TOKEN variable.")
    return "start it with `ray start --head` and give its address (or auto on that machine) as --ray-address."


def _public(host: str) -> bool:
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host != "localhost"


async def start_server(backend, model, settings, host: str, port: int):
    """Listen on host:port (0: a free port) -> (the aiohttp runner, to clean up; the (host, port) bound)."""
    from aiohttp import web

    from .app import build_app

    # handler_cancellation: a client that leaves cancels its handler, whose request then frees the engine.
    runner = web.AppRunner(build_app(backend, model, settings), handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, tuple(runner.addresses[0][:2])


async def _until_stopped() -> None:
    """Return on Ctrl-C or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # Windows: Ctrl-C raises KeyboardInterrupt instead
            pass
    await stop.wait()


async def _run(make_backend, args) -> None:
    from .app import Settings

    backend, model, summary = make_backend()
    settings = Settings(api_key=args.api_key, chunk_frames=args.chunk_frames,
                        first_chunk_frames=args.first_chunk_frames)
    try:
        runner, (host, port) = await start_server(backend, model, settings, args.host, args.port)
    except BaseException:
        backend.close()
        raise
    try:
        print(f"serving {model.id} ({summary}) on http://{host}:{port}; API key "
              f"{'required' if args.api_key else 'off'}", file=sys.stderr, flush=True)
        if _public(args.host) and not args.api_key:
            print("warning: listening beyond this machine without an API key: anyone who reaches the port can use "
                  "it. Give --api-key.", file=sys.stderr, flush=True)
        await _until_stopped()
    finally:
        await runner.cleanup()
        backend.close()
