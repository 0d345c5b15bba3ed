"""The options of `python -m engine serve` beyond the load options it shares with `synth` (engine/cli.py)."""
from __future__ import annotations

import argparse
import os

API_KEY_ENV = "QWEN3TTS_API_KEY"


def add_serve_options(p: argparse.ArgumentParser) -> None:
    from ..cli import path_option
    from ..limits import MAX_ROWS, MAX_TAKES

    p.add_argument("--host", default="127.0.0.1", help="address to listen on; another machine reaches the server "
                                                       "only if this is a public address of this one")
    p.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                   help=f"require 'Authorization: Bearer KEY' on every endpoint but /health (default: the "
                        f"{API_KEY_ENV} environment variable, else none; the variable keeps the key out of the "
                        "process list)")
    p.add_argument("--voices", type=path_option, help="folder of saved voice files (NAME.safetensors, from SaveVoice or "
                                               "Voice.save) that a request names as its voice (default: none)")
    p.add_argument("--max-takes", type=int, default=4, help=f"most takes one request may ask for, 1 to {MAX_TAKES}")
    p.add_argument("--max-rows", type=int, default=16,
                   help=f"rows decoded at once, over all requests (each take is a row), --max-takes to {MAX_ROWS}. "
                        "The graphs of that many rows are captured at load, and each row holds a K/V cache")
    p.add_argument("--max-queue", type=int, default=16, help="requests that may wait for free rows; past it a "
                                                             "request gets 503")
    p.add_argument("--boundary-frames", type=int, default=2,
                   help="frames between the points where waiting requests join the running ones; fewer: earlier "
                        "first audio under load, more pauses of the decode loop")
    p.add_argument("--chunk-frames", type=int, default=8, help="frames per streamed chunk (12.5 frames a second)")
    p.add_argument("--first-chunk-frames", type=int, default=1,
                   help="frames of the first chunk, for earlier first audio; 0: as long as the others")
    p.add_argument("--ray", action="store_true", help="serve through engine replicas on Ray Serve, one per GPU of the "
                                                      "Ray cluster (needs pip install \"ray[serve]\")")
    p.add_argument("--replicas", type=int, help="with --ray: engine replicas to run (default: one per GPU of the "
                                                "cluster; 1 on CPU)")
    p.add_argument("--ray-address", help="with --ray: the Ray cluster to join ('auto': the one `ray start --head` "
                                         "started on this machine; default: start one here)")


def check_serve_args(args) -> None:
    """Every serve option checked before the checkpoint loads; errors name the option."""
    from .. import checks
    from ..errors import InvalidInputError
    from ..limits import MAX_ROWS, MAX_TAKES
    from ..sampling import MAX_NEW_TOKENS

    if not args.host.strip():  # an empty host would listen on every address of the machine
        raise InvalidInputError("--host is empty; give 127.0.0.1 (this machine only) or the address to listen on.")
    checks.whole_number("--port", args.port, 0, 65535)
    checks.whole_number("--max-takes", args.max_takes, 1, MAX_TAKES)
    checks.whole_number("--max-rows", args.max_rows, args.max_takes, MAX_ROWS,
                        "every request's takes must fit the rows: give --max-rows at least --max-takes.")
    checks.whole_number("--max-queue", args.max_queue, 1, 1 << 16)
    checks.whole_number("--boundary-frames", args.boundary_frames, 1, MAX_NEW_TOKENS,
                        "2 frames (0.16 s) is typical.")
    checks.whole_number("--chunk-frames", args.chunk_frames, 1, MAX_NEW_TOKENS, "8 frames (0.64 s) is typical.")
    checks.whole_number("--first-chunk-frames", args.first_chunk_frames, 0,
                        min(args.chunk_frames, args.boundary_frames),
                        "0 makes the first chunk as long as the others; 1 gives the earliest first audio. It is at "
                        "most --chunk-frames and --boundary-frames.")
    if args.voices is not None and not args.voices.is_dir():
        raise InvalidInputError(f"--voices {args.voices} is not a folder; give the folder that holds the saved "
                                "voice files (NAME.safetensors).")
    if not args.ray and (args.replicas is not None or args.ray_address is not None):
        option = "--replicas" if args.replicas is not None else "--ray-address"
        raise InvalidInputError(f"{option} applies to --ray only; add --ray, or leave {option} out.")
    if args.replicas is not None:
        checks.whole_number("--replicas", args.replicas, 1, 1 << 12)
    if args.ray_address is not None and not args.ray_address.strip():
        raise InvalidInputError("--ray-address is empty; give 'auto' or the head node's HOST:PORT, or leave the "
                                "option out to start Ray on this machine.")
    if args.api_key is not None and not args.api_key.strip():
        raise InvalidInputError("--api-key is empty; give a key, or leave the option out to serve without one.")
