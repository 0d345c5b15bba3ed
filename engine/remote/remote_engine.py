"""RemoteEngine: a speech server used through the Engine API the nodes use (generate, stream, extract_voice and
the model's facts). Every take of every item is its own request, and up to `in_flight` of them are open at
once, so a script's lines, a long text's pieces and a run's takes spread over the server's rows and replicas.
Take i of an item is asked for as first_take + i of the item's seed: the random stream a local engine draws it
from, so the same seed gives the same codes here and there, and the same audio within the float rounding of a
codec that decodes rows together or apart. Audio travels as float32 (sample_format f32)."""
from __future__ import annotations

import base64
import dataclasses
import queue
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import torch

from .. import audio, checks
from ..callbacks import guarded
from ..config import SAMPLE_RATE, SAMPLES_PER_FRAME
from ..engine import BatchItem, Chunk, Result, as_items
from ..errors import GenerationInterrupted, InvalidInputError, ModeError, VoiceError
from ..loading import EngineInfo
from ..prompt import MODE_OF_MODEL
from ..sampling import MAX_NEW_TOKENS, SamplingParams
from ..voice import Voice
from .config import RemoteConfig
from .errors import ServerProtocolError
from .http import Group, Server

IN_FLIGHT = 16  # requests open at once where the server does not say; more wait on this side
POLL_S = 0.05  # how often should_stop is asked while requests run
NO_CODES = torch.zeros(0, 16, dtype=torch.long)  # the server sends audio only


@dataclass
class RemoteInfo(EngineInfo):
    """What the server runs, as EngineInfo says it for a local engine; model_dir is the server's URL."""

    server_summary: str = ""  # the server's own summary line

    def summary(self) -> str:
        return f"{self.server_summary or self.model_type} (served by {self.model_dir})"


class RemoteEngine:
    def __init__(self, server: Server, facts: dict):
        try:
            self.model_type = str(facts["model_type"])
            self.mode = MODE_OF_MODEL[self.model_type]
            self.speakers = list(facts.get("speakers") or [])
            self.languages = list(facts.get("languages") or [])
            self.sample_rate = int(facts.get("sample_rate", SAMPLE_RATE))
            self.max_takes = int(facts["max_takes"])
            self.defaults = SamplingParams(**facts["defaults"])
            self.model_id = str(facts.get("id", ""))
            max_seq_len = int(facts.get("max_seq_len", 4096))
        except (KeyError, TypeError, ValueError) as exc:
            raise ServerProtocolError(server.url, f"GET /v1/engine lacks or garbles {exc}") from None
        self.server = server
        self.config = RemoteConfig(server.url, server.api_key, self.max_takes, max_seq_len)
        self.info = RemoteInfo(model_dir=server.url, model_type=self.model_type,
                               model_size=str(facts.get("model_size", "")), device=str(facts.get("device", "")),
                               dtype=str(facts.get("dtype", "")), cuda_graphs=bool(facts.get("cuda_graphs")),
                               kernels=list(facts.get("kernels") or []), notes=list(facts.get("notes") or []),
                               random_weights=bool(facts.get("random_weights")),
                               server_summary=str(facts.get("summary", "")))
        self.in_flight = _in_flight(facts.get("max_queue"), facts.get("max_rows"))

    @classmethod
    def connect(cls, url: str, api_key: str | None = None) -> RemoteEngine:
        """Reach the server and read what it serves; a server that cannot be used raises a RemoteError."""
        server = Server(url, api_key)
        return cls(server, server.json("GET", "/v1/engine"))

    # -- the Engine API ------------------------------------------------------------------------

    def generate(self, what, *, takes: int = 1, seed: int = 0, first_take: int = 0,
                 params: SamplingParams | None = None, on_progress=None, should_stop=None, max_rows=None,
                 chunk_frames: int = 4):
        """As Engine.generate: a Result for a Request, one per item for a list of BatchItem."""
        on_progress, should_stop = guarded("on_progress", on_progress), guarded("should_stop", should_stop)
        items, single = self._items(what, takes, seed, first_take, "generate")
        params = (params or self.defaults).validate()
        rows = [(k, i) for k, item in enumerate(items) for i in range(item.takes)]
        bodies = self._bodies(items, rows, params)
        total = sum(self._budget(items[k], params) for k, _ in rows)
        done = 0

        def one(body, group):
            answer = self.server.json("POST", "/v1/audio/speech", body, group)
            try:
                take = answer["takes"][0]
                codes = np.frombuffer(base64.b64decode(take.get("codes", "")), dtype="<i2").reshape(-1, 16)
                return np.frombuffer(base64.b64decode(take["audio"]), dtype="<f4"), codes
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise ServerProtocolError(self.server.url, f"a json speech answer lacks its audio ({exc})") from None

        def finished(_, answer):
            nonlocal done
            done += len(answer[0]) // SAMPLES_PER_FRAME
            if on_progress is not None:
                on_progress(min(done, total), total)

        t0 = time.perf_counter()
        waves = self._run_all([lambda g, b=b: one(b, g) for b in bodies], should_stop, finished)
        results = []
        for k, item in enumerate(items):
            mine = [torch.from_numpy(w.copy()) for (owner, _), (w, _) in zip(rows, waves) if owner == k]
            codes = [torch.from_numpy(c.astype(np.int64)) for (owner, _), (_, c) in zip(rows, waves) if owner == k]
            lengths = [int(w.numel()) for w in mine]
            audio = torch.zeros(len(mine), max(lengths))
            for i, w in enumerate(mine):
                audio[i, : w.numel()] = w
            frames = [n // SAMPLES_PER_FRAME for n in lengths]
            results.append(Result(audio=audio, lengths=lengths, codes=codes,
                                  sample_rate=self.sample_rate,
                                  stats={"frames": max(frames), "frames_per_take": frames, "server": self.server.url,
                                         "wall_s": time.perf_counter() - t0, "audio_s": max(lengths) / SAMPLE_RATE}))
        return results[0] if single else results

    def stream(self, what, *, takes: int = 1, seed: int = 0, first_take: int = 0,
               params: SamplingParams | None = None, chunk_frames: int = 8, first_chunk_frames: int = 0,
               max_rows=None, on_progress=None, should_stop=None):
        """As Engine.stream: Chunks of every take of every item as they come (each take is a streamed request;
        a take's last Chunk, final, carries no audio). Closing the generator closes the requests."""
        on_progress, should_stop = guarded("on_progress", on_progress), guarded("should_stop", should_stop)
        items, _ = self._items(what, takes, seed, first_take, "stream")
        checks.whole_number("chunk_frames", chunk_frames, 1, MAX_NEW_TOKENS,
                            "8 frames (0.64 s) is typical.")
        checks.whole_number("first_chunk_frames", first_chunk_frames, 0, chunk_frames,
                            "0 makes the first chunk as long as the others; 2 gives the earliest first audio.")
        params = (params or self.defaults).validate()
        rows = [(k, i) for k, item in enumerate(items) for i in range(item.takes)]
        bodies = self._bodies(items, rows, params)
        for (k, _), body in zip(rows, bodies):
            body.update(stream=True, response_format="pcm", chunk_frames=chunk_frames,
                        first_chunk_frames=first_chunk_frames if k == 0 else 0)  # as a local stream's rows
        return self._stream(rows, bodies, items, params, chunk_frames, first_chunk_frames, on_progress, should_stop)

    def _stream(self, rows, bodies, items, params, chunk_frames, first_chunk_frames, on_progress, should_stop):
        out: queue.Queue = queue.Queue()
        group = Group()
        total = sum(self._budget(items[k], params) for k, _ in rows)
        t0 = time.perf_counter()

        def pull(row, body):
            k, i = row
            call = self.server.open("POST", "/v1/audio/speech", body, group)
            try:
                index, frames = 0, (first_chunk_frames if k == 0 and first_chunk_frames else chunk_frames)
                while True:
                    data = call.read(frames * SAMPLES_PER_FRAME * 4)
                    if not data:
                        break
                    if len(data) % 4:
                        raise ServerProtocolError(self.server.url, "a stream ended inside a sample")
                    audio = torch.from_numpy(np.frombuffer(data, dtype="<f4").copy())
                    out.put(Chunk(item=k, take=i, audio=audio, codes=NO_CODES, index=index, final=False,
                                  elapsed_s=time.perf_counter() - t0))
                    index, frames = index + 1, chunk_frames
                out.put(Chunk(item=k, take=i, audio=torch.zeros(0), codes=NO_CODES, index=index, final=True,
                              elapsed_s=time.perf_counter() - t0))
            finally:
                call.close()

        def run(row, body):
            try:
                pull(row, body)
            except BaseException as exc:  # noqa: BLE001  handed to the consumer, which raises it
                out.put(exc)

        pool = ThreadPoolExecutor(max_workers=min(len(rows), self.in_flight), thread_name_prefix="qwen3tts-stream")
        ended, done = 0, 0
        try:
            for row, body in zip(rows, bodies):
                pool.submit(run, row, body)
            while ended < len(rows):
                if should_stop is not None and should_stop():
                    raise GenerationInterrupted("stopped: should_stop() returned True")
                try:
                    got = out.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if isinstance(got, BaseException):
                    raise got
                ended += got.final
                done += got.audio.numel() // SAMPLES_PER_FRAME
                if on_progress is not None and got.audio.numel():
                    on_progress(min(done, total), total)
                yield got
        finally:
            group.cancel()  # a no-op for requests that ended; cuts off the rest, which frees the server's rows
            pool.shutdown(wait=True, cancel_futures=True)

    def extract_voice(self, waveform, sample_rate: int, ref_text: str | None = None):
        """As Engine.extract_voice; the server extracts it from the audio, sent as a float WAV."""
        checks.text_value("ref_text", ref_text, optional=True)
        checks.whole_number("sample_rate", sample_rate, 1, 1 << 31)
        body = {"reference_audio": base64.b64encode(audio.float_wav_bytes(waveform, int(sample_rate))).decode("ascii")}
        if ref_text is not None and ref_text.strip():
            body["reference_text"] = ref_text
        answer = self.server.json("POST", "/v1/audio/voice", body)
        try:
            data = base64.b64decode(answer["voice_data"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ServerProtocolError(self.server.url, f"the voice answer lacks voice_data ({exc})") from None
        return Voice.from_bytes(data, "the server's voice")

    def check_voice(self, voice) -> None:
        """A voice of another model size is refused here, as a local engine refuses it; the server checks the
        rest with every request that carries the voice."""
        voice.check_contents()
        if self.info.model_size and voice.model_size != self.info.model_size:
            raise VoiceError(f"this voice was extracted with a {voice.model_size} model but the server at "
                             f"{self.server.url} runs a {self.info.model_size} model. Speaker embeddings do not carry "
                             "over between model sizes: extract the voice again with this model.")

    def release(self) -> None:
        """Nothing is held here: the server keeps its model loaded."""

    # -- requests ------------------------------------------------------------------------------

    def _items(self, what, takes, seed, first_take, caller: str) -> tuple[list, bool]:
        """engine.as_items, then what this server can take: its --max-takes and its checkpoint's mode."""
        items, single = as_items(what, takes, seed, first_take, caller)
        for item in items:
            checks.whole_number("takes", item.takes, 1, self.max_takes, "The server's --max-takes is the most.")
            if item.request.mode != self.mode:
                raise ModeError(f"the server's model is {self.model_type}, which serves mode '{self.mode}', not "
                                f"'{item.request.mode}'; point the loader at a server of the right checkpoint.")
        return items, single

    def _budget(self, item: BatchItem, params: SamplingParams) -> int:
        return item.max_new_tokens or params.max_new_tokens

    def _bodies(self, items: list, rows: list, params: SamplingParams) -> list[dict]:
        """One json speech request per (item, take), float samples, every sampling setting spelled out."""
        sampling = dataclasses.asdict(params)
        voices: dict = {}  # id(voice) -> voice_data: each voice is encoded once per call
        bodies = []
        for k, i in rows:
            item = items[k]
            req = item.request
            for name in ("non_streaming_mode", "icl"):
                if getattr(req, name, None) is not None:
                    raise InvalidInputError(f"a server request takes no {name}; leave it None (the server uses the "
                                            "checkpoint's choice).")
            body = {"input": req.text, "language": req.language or "auto", "seed": item.seed, "takes": 1,
                    "first_take": item.first_take + i, "response_format": "json", "sample_format": "f32",
                    **sampling}
            if item.max_new_tokens is not None:
                body["max_new_tokens"] = min(item.max_new_tokens, params.max_new_tokens)
                body["min_new_tokens"] = min(params.min_new_tokens, body["max_new_tokens"])
            if req.instruct and req.instruct.strip() and self.mode != "clone":
                body["instructions"] = req.instruct
            if self.mode == "custom":
                body["voice"] = req.speaker
            elif self.mode == "clone":
                if req.voice is None:
                    raise InvalidInputError("a Base checkpoint clones a voice; give the request a voice.")
                if id(req.voice) not in voices:
                    voices[id(req.voice)] = base64.b64encode(req.voice.to_bytes()).decode("ascii")
                body["voice_data"] = voices[id(req.voice)]
            bodies.append(body)
        return bodies

    def _run_all(self, jobs: list, should_stop, on_done=None) -> list:
        """Run `jobs` (functions of a Group) on threads, up to in_flight at once; the results in order. The first
        error, or should_stop(), cuts every other request off and is raised."""
        group = Group()
        results = [None] * len(jobs)
        if not jobs:
            return results
        with ThreadPoolExecutor(max_workers=min(len(jobs), self.in_flight), thread_name_prefix="qwen3tts-remote") \
                as pool:
            futures = {pool.submit(job, group): k for k, job in enumerate(jobs)}
            pending = set(futures)
            try:
                while pending:
                    if should_stop is not None and should_stop():
                        raise GenerationInterrupted("stopped: should_stop() returned True")
                    finished, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
                    for f in finished:
                        k = futures[f]
                        results[k] = f.result()
                        if on_done is not None:
                            on_done(k, results[k])
            except BaseException:
                group.cancel()
                for f in pending:
                    f.cancel()
                raise
        return results


def _in_flight(max_queue, max_rows) -> int:
    """Requests to keep open: enough to fill the server's rows (each take is a row), but never more than its
    queue holds, since every request may wait before the loop admits it: a lone client is never refused."""
    known = [n for n in (max_queue, max_rows) if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    if not known:
        return IN_FLIGHT
    want = max(IN_FLIGHT, max_rows) if max_rows in known else IN_FLIGHT
    return min(want, max_queue) if max_queue in known else want
