"""POST /v1/audio/speech: a checked request becomes one request of the backend, sent whole or streamed as raw PCM."""
from __future__ import annotations

import json
import logging

import torch
from aiohttp import web

from .api_errors import FieldError
from .app_keys import BACKEND, MODEL, SETTINGS
from .encode import CONTENT_TYPES, PCM_HEADERS, encode, pcm_bytes
from .encode_f32 import F32_HEADERS, f32_bytes, takes_json
from .server_timing import StepTimes
from .speech_request import Speech, parse

log = logging.getLogger(__name__)


async def read_json(request: web.Request):
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise FieldError(None, f"the request body is larger than the server's limit of "
                               f"{request.app[SETTINGS].max_body // (1 << 20)} MiB; send a shorter reference "
                               "audio.", status=413) from None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FieldError(None, f"the request body is not valid JSON ({exc}); send a JSON object with "
                               "Content-Type: application/json.") from None


async def speech(request: web.Request) -> web.StreamResponse:
    app = request.app
    settings, backend, times = app[SETTINGS], app[BACKEND], StepTimes()
    job = parse(await read_json(request), app[MODEL])
    if job.reference is not None:
        job.request.voice = await backend.extract_voice(*job.reference, job.reference_text)
    times.mark("parse")
    chunk_frames = job.chunk_frames or settings.chunk_frames
    first = job.first_chunk_frames if job.first_chunk_frames is not None else min(settings.first_chunk_frames,
                                                                                   chunk_frames)
    ticket = await backend.submit(job.request, takes=job.takes, seed=job.seed, first_take=job.first_take,
                                  params=job.params, chunk_frames=chunk_frames, first_chunk_frames=first)
    times.mark("submit")
    try:
        if job.stream:
            return await _stream(request, ticket, times, job.sample_format)
        return await _whole(app[MODEL].id, job, ticket, times)
    finally:
        ticket.cancel()  # a no-op after the end; frees the engine when the client left or the handler failed


async def _whole(model_id: str, job: Speech, ticket, times: StepTimes) -> web.Response:
    parts, codes = [[] for _ in range(job.takes)], [[] for _ in range(job.takes)]
    async for chunk in ticket:
        parts[chunk.take].append(chunk.audio)
        codes[chunk.take].append(chunk.codes)
    times.mark("audio")
    timing = times.header()
    takes = [torch.cat(p).numpy() if p else torch.zeros(0).numpy() for p in parts]
    if job.response_format == "json":
        frames = [torch.cat(c) if c else torch.zeros(0, 16, dtype=torch.long) for c in codes]
        return web.json_response(takes_json(model_id, job.seed, job.first_take, takes, job.sample_format, frames),
                                 headers=timing)
    if job.sample_format == "f32":
        return web.Response(body=f32_bytes(takes[0]), content_type=CONTENT_TYPES["pcm"],
                            headers={**F32_HEADERS, **timing})
    headers = PCM_HEADERS if job.response_format == "pcm" else {}
    return web.Response(body=encode(job.response_format, takes[0]), content_type=CONTENT_TYPES[job.response_format],
                        headers={**headers, **timing})


async def _stream(request: web.Request, ticket, times: StepTimes, sample_format: str = "s16") -> web.StreamResponse:
    """Chunked raw PCM as the chunks come. The headers wait for the first chunk, so an error the request causes
    still gets its JSON 4xx; a failure after that can only cut the response short, which the client sees as a
    broken chunked body rather than a short, complete one."""
    try:
        first = await ticket.__anext__()
    except StopAsyncIteration:
        first = None
    times.mark("audio")
    pack, headers = (f32_bytes, F32_HEADERS) if sample_format == "f32" else (pcm_bytes, PCM_HEADERS)
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPES["pcm"], **headers, **times.header()})
    response.enable_chunked_encoding()
    await response.prepare(request)
    try:
        if first is not None and first.audio.numel():
            await response.write(pack(first.audio))
        async for chunk in ticket:
            if chunk.audio.numel():
                await response.write(pack(chunk.audio))
    except ConnectionError:  # the client left: the handler's finally cancels the request
        return response
    except Exception:
        log.exception("a streamed request failed after its first audio; the response is cut short")
        if request.transport is not None:
            request.transport.abort()
        return response
    await response.write_eof()
    return response
