"""The Orpheus engine: slot state on the device, prefill, the batched decode step, ticks.

Pure compute like the Piper engine (no asyncio, sockets or clocks beyond timing its own work),
driven from one worker thread. One :meth:`tick` runs a :class:`~.scheduler.TickPlan`: resets of
released/claimed slots, prompt chunks, one decode step for the committing slots, then the SNAC
windows that became ready - and returns what each slot produced, tagged with the stream id
that owned the slot when the plan was made (the gate).

Decode-step state lives in device tensors indexed by slot (current token, position, tokens
generated, sampling options, repetition-penalty presence). The step reads and updates them in
place, so on a GPU it is captured once per (batch bucket, key-length bucket) as a CUDA graph and
replayed: one launch per step instead of ~700. Per-step host work is one copy of the commit
mask in and one copy of the sampled tokens out.

Rows that must not touch their cache row (free slots, slots still prefilling) sit at the
scratch position ``max_len - 1``, which no stream ever reaches. Rows that skip a step (paced)
keep their real position: they rewrite the key/value of the token they will be fed next time,
which that next step overwrites before any read.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..core.engine import Engine, VoiceInfo
from . import sampler
from .codec import WindowedCodec
from .config import SAMPLE_RATE, Sampling
from .model import Transformer
from .scheduler import Claim, PrefillJob, SlotEvent, TickPlan, TickResult
from .tokens import END_OF_SPEECH, FRAME, VOICES, PhaseError, build_prompt, frame_codes

log = logging.getLogger(__name__)


def _buckets(limit: int, base: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted({b for b in base if b < limit} | {limit}))


BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
LEN_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(slots=True)
class EngineOptions:
    max_slots: int = 16
    max_len: int = 2048  # prompt + generated tokens per segment (+1 scratch column)
    max_new_tokens: int = 1400  # per segment: 1400 tokens = 200 frames = 17 s of audio
    cuda_graphs: bool = True  # on CUDA only; CPU always runs eagerly
    codec_left: int = 3
    codec_right: int = 2
    codec_chunks: tuple[int, ...] = (1, 2, 4, 8)


@dataclass(slots=True)
class _Slot:
    sid: int | None = None
    prompt_len: int = 0
    pos: int = 0  # host mirror of the device position (valid once decoding)
    gen: int = 0
    max_new: int = 0
    decoding: bool = False
    partial: list[int] = field(default_factory=list)  # tokens of the frame being generated


class _State:
    """Per-slot decode state on the device; every tensor has ``max_slots`` rows."""

    def __init__(self, slots: int, device: torch.device, scratch: int) -> None:
        z = dict(device=device)
        self.cur_tok = torch.zeros(slots, dtype=torch.long, **z)
        self.pos = torch.full((slots,), scratch, dtype=torch.long, **z)
        self.gen = torch.zeros(slots, dtype=torch.long, **z)
        self.commit = torch.zeros(slots, dtype=torch.bool, **z)
        self.temperature = torch.zeros(slots, dtype=torch.float32, **z)
        self.top_p = torch.ones(slots, dtype=torch.float32, **z)
        self.penalty = torch.ones(slots, dtype=torch.float32, **z)
        self.presence = torch.zeros(slots, sampler.WINDOW, dtype=torch.bool, **z)
        self.out = torch.zeros(slots, dtype=torch.long, **z)
        pin = device.type == "cuda"
        self.commit_host = torch.zeros(slots, dtype=torch.bool, pin_memory=pin)


class OrpheusEngine(Engine):
    """Voices, slots and the model; fits :class:`tts_service.core.engine.Engine`."""

    # The speaking rate is whatever the LLM's audio tokens say; nothing here scales durations, so
    # a stream asking for another rate is refused (core.runtime) rather than spoken at this one.
    speed_range: tuple[float, float] | None = None

    def __init__(
        self,
        model: Transformer,
        codec: WindowedCodec,
        tokenizer,
        *,
        voices: tuple[str, ...] = VOICES,
        default_voice: str | None = None,
        options: EngineOptions | None = None,
        model_path: str = "",
        random_weights: str | None = None,
    ) -> None:
        self.opt = options or EngineOptions()
        self.model = model
        self.codec = codec
        self.tokenizer = tokenizer
        self.random_weights = random_weights
        self.device = model.tok_embeddings.weight.device
        self.max_slots, self.max_len = self.opt.max_slots, self.opt.max_len
        self.scratch = self.max_len - 1
        model.setup_cache(self.max_slots, self.max_len)
        self.voices = {v: VoiceInfo(v, SAMPLE_RATE, model_path or "random") for v in voices}
        self.default_voice = default_voice or voices[0]
        self.resolve(self.default_voice)
        self._state = _State(self.max_slots, self.device, self.scratch)
        self._slots = [_Slot() for _ in range(self.max_slots)]
        self.batch_buckets = _buckets(self.max_slots, BATCH_BUCKETS)
        self.len_buckets = _buckets(self.max_len, LEN_BUCKETS)
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.step_times: dict[int, float] = {}  # measured at warm-up, by batch bucket
        self.last_batch = 0

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    def describe_voices(self) -> list[VoiceInfo]:
        return list(self.voices.values())

    def prompt_ids(self, text: str, voice: str | None) -> list[int]:
        return build_prompt(self.tokenizer, text, self.resolve(voice))

    @property
    def max_prompt(self) -> int:
        """Longest prompt that leaves room for a few seconds of audio in a slot."""
        return self.max_len - 1 - 32 * FRAME

    # ------------------------------------------------------------ slot verbs
    @torch.inference_mode()
    def claim(self, slot: int, sid: int, prompt_len: int, sampling: Sampling) -> None:
        """Give ``slot`` to stream ``sid``: its cache row, state and codec buffer start empty."""
        room = (self.max_len - 1 - prompt_len) // FRAME * FRAME
        max_new = min(self.opt.max_new_tokens, room)
        if max_new < FRAME:
            raise ValueError(f"prompt of {prompt_len} tokens leaves no room in max_len {self.max_len}")
        self._slots[slot] = _Slot(sid=sid, prompt_len=prompt_len, max_new=max_new)
        self.model.reset_slot(slot)
        st = self._state
        st.pos[slot] = self.scratch
        st.cur_tok[slot] = 0
        st.gen[slot] = 0
        st.presence[slot] = False
        st.temperature[slot] = sampling.temperature
        st.top_p[slot] = sampling.top_p
        st.penalty[slot] = sampling.repetition_penalty
        self.codec.reset(slot)

    def release(self, slot: int) -> None:
        self._slots[slot] = _Slot()
        self._state.pos[slot] = self.scratch
        self.codec.reset(slot)

    @torch.inference_mode()
    def prefill(self, jobs: list[PrefillJob]) -> None:
        """Write prompt chunks; chunks starting at 0 share one batched call."""
        fresh = [j for j in jobs if j.start == 0 and j.stop > 0]
        if fresh:
            T = max(j.stop for j in fresh)
            ids = torch.zeros(len(fresh), T, dtype=torch.long)
            for b, j in enumerate(fresh):
                ids[b, : j.stop] = torch.tensor(j.ids[: j.stop])
            dev = self.device
            self.model.prefill(
                ids.to(dev),
                torch.tensor([j.slot for j in fresh], device=dev),
                torch.tensor([j.stop for j in fresh], device=dev),
            )
        for j in jobs:
            if j.start > 0 and j.stop > j.start:
                chunk = torch.tensor([j.ids[j.start : j.stop]], device=self.device)
                self.model.extend(chunk, j.slot, j.start)
        ready = [j for j in jobs if j.last]
        if ready:
            rows = torch.tensor([j.slot for j in ready], device=self.device)
            self._state.cur_tok[rows] = torch.tensor([j.ids[-1] for j in ready], device=self.device)
            self._state.pos[rows] = torch.tensor([len(j.ids) - 1 for j in ready], device=self.device)
            for j in ready:
                s = self._slots[j.slot]
                s.pos, s.decoding = len(j.ids) - 1, True

    def _step_fn(self, n: int, L: int) -> None:
        """The hot step over rows [0, n), keys [0, L): everything in place, no host sync."""
        st, m = self._state, self.model
        hidden = m.decode(st.cur_tok[:n], st.pos[:n], L)  # [n, dim]
        logits = F.linear(hidden, m.audio_head)  # [n, WINDOW]
        nxt = sampler.sample(logits, st.gen[:n], st.presence[:n], st.temperature[:n], st.top_p[:n], st.penalty[:n])
        commit = st.commit[:n]
        sampler.mark_seen(st.presence[:n], nxt, commit)
        st.cur_tok[:n] = torch.where(commit, nxt, st.cur_tok[:n])
        st.pos[:n] += commit
        st.gen[:n] += commit
        st.out[:n] = nxt

    def _bucket(self, value: int, buckets: tuple[int, ...]) -> int:
        for b in buckets:
            if b >= value:
                return b
        raise ValueError(f"{value} exceeds the largest bucket {buckets[-1]}")

    @torch.inference_mode()
    def step(self, commit: list[int]) -> dict[int, int]:
        """One decode step; returns the sampled token of each committing slot."""
        if not commit:
            return {}
        for s in commit:
            if not self._slots[s].decoding:
                raise RuntimeError(f"slot {s} is not ready to decode (prefill its prompt first)")
        occupied = [i for i, s in enumerate(self._slots) if s.sid is not None] + commit
        n = self._bucket(max(occupied) + 1, self.batch_buckets)
        L = self._bucket(max(self._slots[s].pos for s in commit) + 1, self.len_buckets)
        host = self._state.commit_host
        host.zero_()
        host[commit] = True
        self._state.commit.copy_(host, non_blocking=True)
        graph = self._graphs.get((n, L))
        if graph is not None:
            graph.replay()
        else:
            self._step_fn(n, L)
        out = self._state.out[:n].tolist()  # the one sync per step
        result = {}
        for s in commit:
            slot = self._slots[s]
            slot.pos += 1
            slot.gen += 1
            result[s] = out[s]
        self.last_batch = n
        return result

    # ------------------------------------------------------------ ticks
    @torch.inference_mode()
    def tick(self, plan: TickPlan) -> TickResult:
        t0 = time.perf_counter()
        for slot in plan.releases:
            self.release(slot)
        for c in plan.claims:
            self._claim(c)
        if plan.prefills:
            self.prefill(plan.prefills)
        t1 = time.perf_counter()
        events: dict[int, SlotEvent] = {}
        tokens = self.step(plan.decode)
        t2 = time.perf_counter()
        finished: list[int] = []
        for slot, tok in tokens.items():
            ev = events[slot] = SlotEvent(sid=plan.owners[slot], tokens=1)
            s = self._slots[slot]
            if tok == END_OF_SPEECH:
                finished.append(slot)
                continue
            s.partial.append(tok)
            if len(s.partial) == FRAME:
                try:
                    self.codec.push(slot, frame_codes(s.partial))
                    ev.frames += 1
                except PhaseError as exc:  # cannot happen with the constrained sampler; fail loudly if it does
                    ev.error = f"model emitted an out-of-phase token: {exc}"
                s.partial = []
            if s.gen >= s.max_new or ev.error is not None:
                finished.append(slot)
        for slot in finished:
            self.codec.finish(slot)
            self._slots[slot].decoding = False
        windows = [w for w in self.codec.ready() if self._slots[w.slot].sid is not None]
        for w, audio in zip(windows, self.codec.decode(windows)):
            self.codec.commit(w)
            ev = events.setdefault(w.slot, SlotEvent(sid=plan.owners[w.slot]))
            ev.audio.append(audio)
        for slot in finished:
            if self.codec.pending_frames(slot) == 0:
                self.codec.reset(slot)
            events[slot].done = True
        t3 = time.perf_counter()
        return TickResult(
            events,
            seconds=t3 - t0,
            batch=self.last_batch if tokens else 0,
            prefill_s=t1 - t0,
            step_s=t2 - t1,
            codec_s=t3 - t2,
        )

    def _claim(self, c: Claim) -> None:
        self.claim(c.slot, c.sid, c.prompt_len, c.sampling)

    # ------------------------------------------------------------ warm-up and graphs
    @torch.inference_mode()
    def warm_up(self, *, capture: bool | None = None, progress=print) -> dict[int, float]:
        """Run every batch bucket once (capturing CUDA graphs on a GPU) and time the steps.

        The timings seed admission control before the first real stream arrives. All slots
        are left free and reset.
        """
        capture = self.opt.cuda_graphs if capture is None else capture
        if self.device.type == "cuda" and capture:
            t0 = time.perf_counter()
            try:
                self._capture_graphs()
                progress(f"captured {len(self._graphs)} CUDA graphs in {time.perf_counter() - t0:.1f} s")
            except Exception as exc:  # a driver/backend limitation must not stop serving: run eagerly
                log.warning("CUDA graph capture failed (%s); decoding eagerly", exc)
                self._graphs.clear()
        # Time a realistic step per bucket: every row committing, keys up to a mid-segment length.
        L = self._bucket(min(self.max_len, 512), self.len_buckets)
        st = self._state
        for n in self.batch_buckets:
            for i in range(n):
                self._slots[i] = _Slot(sid=-1, decoding=True, pos=L - 2, max_new=1 << 30)
            st.pos[:n] = L - 2
            st.gen[:n] = 0
            commit = list(range(n))
            self.step(commit)  # first run per shape: kernels picked, caches warm
            st.pos[:n] = L - 2
            for i in range(n):
                self._slots[i].pos = L - 2
            self._sync()
            t0 = time.perf_counter()
            reps = 3
            for _ in range(reps):
                self.step(commit)
                st.pos[:n] = L - 2
                for i in range(n):
                    self._slots[i].pos = L - 2
            self._sync()
            self.step_times[n] = (time.perf_counter() - t0) / reps
        for i in range(self.max_slots):
            self.model.reset_slot(i)
            self.release(i)
        st.gen.zero_()
        st.presence.zero_()
        self._warm_codec()
        return dict(self.step_times)

    def _warm_codec(self) -> None:
        """Every window length the chunk schedule makes: first calls per shape pick kernels."""
        longest = self.codec.left + max(self.codec.chunks) + self.codec.right
        for length in range(1, longest + 1):
            self.codec.decode_codes(np.zeros((1, length, FRAME), dtype=np.int64))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _capture_graphs(self) -> None:
        """One graph per (batch, key length) bucket, largest first so later ones reuse the pool."""
        st = self._state
        st.commit.zero_()  # captured steps must not change any slot's state
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        for n in sorted(self.batch_buckets, reverse=True):
            for L in sorted(self.len_buckets, reverse=True):
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    self._step_fn(n, L)  # warm-up run outside the graph (allocations, autotuning)
                torch.cuda.current_stream(self.device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._step_fn(n, L)
                self._graphs[(n, L)] = graph
        self._sync()

    @property
    def graphs(self) -> int:
        return len(self._graphs)

    def kv_cache_bytes(self) -> int:
        c = self.model.cfg
        return self.max_slots * self.max_len * c.kv_bytes_per_token(self.model.tok_embeddings.weight.element_size())
