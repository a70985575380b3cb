"""A small Llama (SmolLM2) for the CPU: weights read from GGUF, int4 matmuls, a conversation KV cache.

Why not transformers' ``generate``: decoding one token reads every weight once, so it is bound by
memory bandwidth, and a float32 model reads ~540 MB a token (135 M parameters x 4 bytes): a few
tens of tokens/s on a CPU whatever the framework (figures: docs/BENCHMARKS.md, "Local LLM"). The
checkpoint is Q4_1 (4-bit codes with a scale and a minimum per block of 32), and torch's CPU kernel
``_weight_int4pack_mm_for_cpu`` computes ``x @ ((q - 8) * scale + zero)`` for exactly that
grouping. So decoding keeps the GGUF's own codes (``zero = min + 8 * scale``; scale/zero rounded to
bf16, the kernel's dtype) and reads ~70 MB per token instead of 540. That kernel is a matrix-vector
one; prefills of more than a few tokens run a dense GEMM on the same weights instead. Activations
are bf16, the residual stream float32. The tied embedding/head is Q8_0 in the file; the head runs
as int8.

The dense copy's dtype follows the CPU (``dense=``, :func:`dense_dtype`): bf16 where the CPU
multiplies bf16 natively (AVX512-BF16, AMX), float32 elsewhere. On an AVX2-only CPU torch emulates
a bf16 GEMM several times slower than a float32 one, so there a 20-token prefill of a bf16 model
costs what a 100-token one should (the figures: docs/BENCHMARKS.md, "Local LLM"); the price of
float32 is the dense copy's memory, twice the bf16 one.

A ``precision="fp32"`` model de-quantises everything to float32 (the values transformers loads
from the same file): it is the reference the tests compare with transformers, not a serving mode.

KV cache: allocated once per slot at ``[kv_heads, max_len, head_dim]`` per layer and written by
position, so a conversation keeps its keys/values between requests and a new turn only runs its
new tokens (:meth:`Llama.forward` with ``start`` = the cached length). Several slots let a few
conversations keep their caches at once. :meth:`Llama.shift` moves a cached span to an earlier
position (re-rotating its keys), so a conversation that drops its oldest turns keeps the rest.

Layouts follow HF transformers: GGUF stores q/k rows permuted for llama.cpp's interleaved RoPE;
the loader undoes that permutation (a row reordering, so 4-bit blocks stay intact) and the model
uses rotate-half RoPE. q/k/v and gate/up are fused into one matmul each. The config, the RoPE
tables and the sampler are the ones the Orpheus TTS backbone uses too (:mod:`llama`); this
module is the CPU forward pass, which stays its own (int4 kernels, one conversation per slot).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from llama import ConfigError, LlamaConfig, hf_names
from llama.attention import grouped_attention
from llama.rope import angles, rotate_half

GROUP = 32  # Q4_1/Q8_0 block length: values per scale
REFINE = 64  # head candidates recomputed in float32 (see Llama._head)
INT4_MAX_ROWS = 16  # above this many rows the dense GEMM (bf16 or fp32) beats the int4 kernel (BENCHMARKS)
DENSE = ("auto", "bf16", "fp32")  # the dense prefill copy's dtype (see dense_dtype)
ALIGN = 64  # bytes: every weight the kernels read starts on a cache line (see Llama.__init__)
CAUSAL_MIN_ROWS = 256  # a fresh prompt longer than this runs causal SDPA (half the work; slower when short)


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (oneDNN's check: AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def dense_dtype(dense: str = "auto") -> str:
    """``"bf16"`` or ``"fp32"``: the dtype of the int4 model's dense copy for prefills.

    ``auto``: bf16 where :func:`native_bf16`, else fp32 (see the module's docstring).
    """
    if dense not in DENSE:
        raise ValueError(f"dense {dense!r}: use one of {', '.join(DENSE)}")
    if dense == "auto":
        return "bf16" if native_bf16() else "fp32"
    return dense


class ModelFormatError(ConfigError):
    """A checkpoint this model cannot run; the message says what is wrong."""


# The model this runtime is tuned for (the GGUF's own metadata says the same).
SMOLLM2_135M = LlamaConfig(
    vocab_size=49152,
    dim=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    head_dim=64,
    intermediate=1536,
    rope_theta=100000.0,
    max_position=8192,
)


def check_runnable(cfg: LlamaConfig) -> LlamaConfig:
    """``cfg`` if this runtime can run it: no RoPE rescaling (Llama 3's) and a tied head."""
    if cfg.rope_scaling:
        raise ModelFormatError("rope scaling is not supported by the local LLM's runtime")
    if not cfg.tie_embeddings:
        raise ModelFormatError("only tied embeddings are supported (SmolLM2 ties lm_head to embed_tokens)")
    return cfg


# ---------------------------------------------------------------------- weights


@dataclass(slots=True)
class Q4Weight:
    """A Q4_1 matrix [rows, cols]: value = codes * scale + minimum, per block of 32 columns."""

    codes: Tensor  # uint8 [rows, cols], 0..15
    scale: Tensor  # float16 [rows, cols / 32]
    minimum: Tensor  # float16 [rows, cols / 32]

    def dequantize(self) -> Tensor:
        rows, cols = self.codes.shape
        blocks = self.codes.view(rows, cols // GROUP, GROUP).float()
        return (blocks * self.scale.float()[..., None] + self.minimum.float()[..., None]).view(rows, cols)

    def take_rows(self, index: Tensor) -> Q4Weight:
        return Q4Weight(self.codes[index], self.scale[index], self.minimum[index])

    @staticmethod
    def quantize(w: Tensor) -> Q4Weight:
        """Round a dense matrix to Q4_1 (min/max per block of 32), for checkpoints that are not Q4_1."""
        rows, cols = w.shape
        if cols % GROUP:
            raise ModelFormatError(f"a [{rows}, {cols}] matrix cannot be split into blocks of {GROUP} columns")
        blocks = w.float().view(rows, cols // GROUP, GROUP)
        lo = blocks.amin(-1).half()
        scale = ((blocks.amax(-1) - lo.float()) / 15).clamp_min(1e-6).half()
        codes = torch.round((blocks - lo.float()[..., None]) / scale.float()[..., None]).clamp(0, 15)
        return Q4Weight(codes.to(torch.uint8).view(rows, cols), scale, lo)

    @staticmethod
    def cat(parts: list[Q4Weight]) -> Q4Weight:
        return Q4Weight(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scale", "minimum")))


Weight = Q4Weight | Tensor  # a dense tensor is float32


def _q4_1(raw: np.ndarray, rows: int, cols: int) -> Q4Weight:
    """GGUF Q4_1 blocks (fp16 d, fp16 m, 16 bytes: low nibbles = values 0-15, high = 16-31)."""
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(rows * cols // GROUP, 20)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(rows, cols // GROUP)
    m = blocks[:, 2:4].copy().view(np.float16).reshape(rows, cols // GROUP)
    qs = blocks[:, 4:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1).reshape(rows, cols)
    return Q4Weight(torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(m))


def _q8_0(raw: np.ndarray, rows: int, cols: int) -> Tensor:
    """GGUF Q8_0 blocks (fp16 d, 32 int8 values) de-quantised to float32."""
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(rows * cols // GROUP, 34)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    return torch.from_numpy((q * d).reshape(rows, cols))


def _rope_rows(rows: int, heads: int) -> Tensor:
    """Row order that undoes llama.cpp's q/k permutation (as transformers' GGUF loader does)."""
    half = rows // heads // 2
    return torch.arange(rows).view(heads, half, 2).transpose(1, 2).reshape(rows)


_GGUF_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def read_gguf(path: str | Path) -> tuple[LlamaConfig, dict[str, Weight], dict]:
    """(config, weights under HF names, GGUF metadata fields) of a llama GGUF file.

    Q4_1 matrices stay 4-bit codes (:class:`Q4Weight`); F32/F16/Q8_0 tensors become float32.
    """
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"cannot read GGUF {path}: {exc}") from None
    fields = {}
    for key, field in reader.fields.items():
        try:
            fields[key] = field.contents()
        except Exception:  # a field gguf cannot decode is one we do not need
            continue
    try:
        cfg = check_runnable(LlamaConfig.from_gguf_fields(fields))
    except ConfigError as exc:
        raise ModelFormatError(f"{path}: {exc}") from None
    weights: dict[str, Weight] = {}
    for t in reader.tensors:
        cols, rows = (int(t.shape[0]), int(t.shape[1])) if len(t.shape) == 2 else (int(t.shape[0]), 1)
        if t.tensor_type == Q.Q4_1:
            w: Weight = _q4_1(t.data, rows, cols)
        elif t.tensor_type == Q.Q8_0:
            w = _q8_0(t.data, rows, cols)
        else:  # F32, F16, K-quants ...: gguf's own de-quantiser (a copy: the reader's arrays are read-only)
            try:
                values = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)
            except NotImplementedError:
                raise ModelFormatError(f"{path}: tensor {t.name} has type {t.tensor_type.name}, unsupported") from None
            w = torch.from_numpy(values.reshape((rows, cols) if rows > 1 else (cols,)))
        weights[_hf_name(t.name)] = w
    for layer in range(cfg.n_layers):
        q, k, _v = hf_names.layer(layer)["wqkv"]
        for key, heads in ((q, cfg.n_heads), (k, cfg.n_kv_heads)):
            w = weights[key]
            order = _rope_rows(w.shape[0] if isinstance(w, Tensor) else w.codes.shape[0], heads)
            weights[key] = w.take_rows(order) if isinstance(w, Q4Weight) else w[order]
    return cfg, weights, fields


def _hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return hf_names.EMBED
    if name == "output_norm.weight":
        return hf_names.NORM
    if name == "output.weight":
        raise ModelFormatError("untied output.weight is not supported (SmolLM2 ties lm_head to embed_tokens)")
    parts = name.split(".")  # blk.N.attn_q.weight
    if parts[0] != "blk" or parts[2] not in _GGUF_NAMES:
        raise ModelFormatError(f"unexpected GGUF tensor {name}")
    return f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[3]}"


def dense(w: Weight) -> Tensor:
    return w.dequantize() if isinstance(w, Q4Weight) else w


# ---------------------------------------------------------------------- the model


def prepare(cfg: LlamaConfig, weights: dict[str, Weight], precision: str = "int4") -> dict[str, Tensor]:
    """The tensors :class:`Llama` runs on, from HF-named weights: what the disk cache stores.

    ``int4``: Q4_1 matrices packed for ``_weight_int4pack_mm_for_cpu`` with bf16 scale/zero
    (``(q - 8) * scale + zero == q * scale + minimum`` with ``zero = minimum + 8 * scale``);
    matrices stored otherwise (an HF directory, other GGUF types) are rounded to Q4_1 first. The
    tied head is int8 with one scale per row, the embedding table bf16, norms float32.
    ``fp32``: everything de-quantised to float32. q/k/v and gate/up are fused (rows
    concatenated, which keeps 4-bit blocks intact).
    """
    if precision not in ("int4", "fp32"):
        raise ValueError(f"precision {precision!r}: use int4 (serving) or fp32 (reference)")
    quantized = precision == "int4"
    dtype = torch.bfloat16 if quantized else torch.float32
    out: dict[str, Tensor] = {}

    def linear(name: str, parts: list[Weight]) -> None:
        if quantized:  # the GGUF's own Q4_1 codes, or (other checkpoints) rounded to Q4_1 here
            w = Q4Weight.cat([x if isinstance(x, Q4Weight) else Q4Weight.quantize(x) for x in parts])
            scale = w.scale.float()
            zero = w.minimum.float() + 8 * scale
            out[name + ".packed"] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(w.codes.to(torch.int32), 1)
            out[name + ".sz"] = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
            # Also dense bf16, for prefills: the int4 kernel is a matrix-vector kernel, several
            # times slower than a bf16 GEMM once a call holds more than a few rows.
            out[name + ".weight"] = w.dequantize().to(torch.bfloat16).contiguous()
        else:
            out[name + ".weight"] = torch.cat([dense(x) for x in parts]).to(dtype).contiguous()

    table = dense(weights[hf_names.EMBED])
    out["embed"] = table.to(dtype).contiguous()
    if quantized:
        # The tied head is the biggest matrix (28M values) and decoding is bound by the bytes it
        # reads: int8 with one scale per row reads half of what a dense bf16 matmul does, every
        # token (the decode speed it gives: docs/BENCHMARKS.md, "Local LLM: long calls and concurrency").
        scale = (table.abs().amax(dim=1) / 127).clamp_min(1e-12)
        out["head.q"] = torch.round(table / scale[:, None]).to(torch.int8)
        out["head.scale"] = scale.to(dtype)
    out["norm"] = dense(weights[hf_names.NORM])  # norms are float32, like the residual stream
    for i in range(cfg.n_layers):
        for part, names in hf_names.layer(i).items():
            if part in hf_names.NORMS:
                out[f"{i}.{part}"] = dense(weights[names[0]])
            else:
                linear(f"{i}.{part}", [weights[n] for n in names])
    return out


class Linear:
    """``x [T, in] -> [T, out]``: the int4 kernel for a few rows (decoding), else a dense matmul.

    ``dense="fp32"`` (an int4 model on a CPU without native bf16): the dense copy is float32 and
    the GEMM runs in float32, its input and output cast (the activations stay bf16).
    """

    def __init__(self, t: dict[str, Tensor], name: str) -> None:
        self.packed, self.sz = t.get(name + ".packed"), t.get(name + ".sz")
        self.weight: Tensor | None = t[name + ".weight"]  # None once Llama.drop_dense ran: int4 only
        self.cast = self.packed is not None and self.weight.dtype == torch.float32  # see Llama's ``dense``

    def __call__(self, x: Tensor) -> Tensor:
        if self.packed is not None and (self.weight is None or x.shape[0] <= INT4_MAX_ROWS):
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.sz)
        if self.cast:
            return F.linear(x.float(), self.weight).to(x.dtype)
        return F.linear(x, self.weight)


class Layer:
    def __init__(self, t: dict[str, Tensor], i: int) -> None:
        self.attn_norm, self.ffn_norm = t[f"{i}.attn_norm"], t[f"{i}.ffn_norm"]
        self.wqkv, self.wo = Linear(t, f"{i}.wqkv"), Linear(t, f"{i}.wo")
        self.w13, self.w2 = Linear(t, f"{i}.w13"), Linear(t, f"{i}.w2")


class Llama:
    """SmolLM2-style Llama: ``forward(tokens, slot, start)`` runs new tokens after ``start`` cached ones.

    Built from :func:`prepare`'s tensors. Not an ``nn.Module``: there is nothing to train, and
    plain attributes keep the per-token Python path short (the decode step is ~400 small ops;
    their overhead is a large part of its time).
    """

    def __init__(
        self, cfg: LlamaConfig, tensors: dict[str, Tensor], *, slots: int = 4, max_len: int = 2048, dense: str = "auto"
    ) -> None:
        """``dense``: the int4 model's dense prefill copy in bf16 or float32 (:func:`dense_dtype`;
        converted in ``tensors``, so a model built on the same tensors shares the copy)."""
        if cfg.n_heads % cfg.n_kv_heads:
            raise ModelFormatError(f"{cfg.n_heads} heads are not a multiple of {cfg.n_kv_heads} KV heads")
        if slots < 1 or max_len < 2:
            raise ValueError("need at least one slot and a cache of at least 2 tokens")
        want = torch.float32 if dense_dtype(dense) == "fp32" else torch.bfloat16
        packed = {n.removesuffix(".packed") for n in tensors if n.endswith(".packed")}
        widen = {n + ".weight" for n in packed if n + ".weight" in tensors and tensors[n + ".weight"].dtype != want}
        # torch's int8 head kernel reads its weight with aligned vector loads from four rows of input
        # on: a weight that is a view into the safetensors file at an odd offset (the int8 head sat at
        # 40 bytes past a 64-byte boundary) crashed the process (SIGSEGV) at the first batched decode
        # step on AVX-512 CPUs. A copy is allocated aligned.
        misaligned = any(t.data_ptr() % ALIGN for t in tensors.values())
        if widen or misaligned:
            # Every other tensor is copied too: tensors read with safetensors' load_file share one
            # mapping of the file, which any of them keeps resident, the widened originals included.
            for name, t in tensors.items():
                tensors[name] = t.to(want) if name in widen else t.clone()
        self.dense = "fp32" if want == torch.float32 or not packed else "bf16"  # the fp32 reference: fp32
        self.cfg, self.tensors = cfg, tensors  # kept: a second model can share them (tests)
        self.embed = tensors["embed"]  # [vocab, dim], also the head when not quantised
        self.dtype = self.embed.dtype
        self.precision = "int4" if "head.q" in tensors else "fp32"
        self.head_q, self.head_scale = tensors.get("head.q"), tensors.get("head.scale")
        if self.head_scale is not None:
            self.head_scale_f32 = self.head_scale.float()
        self.norm = tensors["norm"]
        self.layers = [Layer(tensors, i) for i in range(cfg.n_layers)]
        self.slots, self.max_len = slots, min(max_len, cfg.max_position)
        shape = (slots, cfg.n_kv_heads, self.max_len, cfg.head_dim)
        # ``empty``, not ``zeros``: a position is always written before it is read, and untouched
        # pages of a large allocation cost no memory, so a long context costs only what it holds.
        self.cache_k = [torch.empty(shape, dtype=self.dtype) for _ in self.layers]
        self.cache_v = [torch.empty(shape, dtype=self.dtype) for _ in self.layers]
        emb = angles(cfg, self.max_len, precision=torch.float32)  # [L, hd], as transformers computes it
        self.cos = emb.cos().to(self.dtype)[:, None, :]  # [L, 1, hd]
        self.sin = emb.sin().to(self.dtype)[:, None, :]

    def drop_dense(self) -> None:
        """Free the dense copies of the int4 matrices; every call then runs the int4 kernel.

        For a user that reads only short prompts (``pipelines.text_turn``: a caller's words at a
        pause): the dense copies are most of the weights' memory and only speed up long prefills.
        """
        for layer in self.layers:
            for linear in (layer.wqkv, layer.wo, layer.w13, layer.w2):
                if linear.packed is not None:
                    linear.weight = None
        packed = {n.removesuffix(".packed") for n in self.tensors if n.endswith(".packed")}
        for name in [n for n in self.tensors if n.removesuffix(".weight") in packed and n.endswith(".weight")]:
            del self.tensors[name]

    @torch.inference_mode()
    def forward(self, tokens: list[int] | Tensor, slot: int, start: int) -> Tensor:
        """Run ``tokens`` at positions ``start..`` of ``slot``; float32 logits of the last one [vocab].

        The slot must hold valid keys/values for positions ``< start`` (this conversation's own).
        """
        ids = torch.as_tensor(tokens, dtype=torch.long)
        T = ids.shape[0]
        S = start + T
        if T == 0 or S > self.max_len:
            raise ValueError(f"{T} tokens at {start} do not fit a {self.max_len}-token cache")
        cfg = self.cfg
        H, G, hd = cfg.n_heads, cfg.groups, cfg.head_dim
        cos, sin = self.cos[start:S], self.sin[start:S]
        mask = None
        causal = start == 0 and T > CAUSAL_MIN_ROWS
        if T > 1 and not causal:  # query t sits at start+t and sees keys up to there; rows ordered (g, t)
            keys = torch.arange(S)
            mask = (keys[None, :] <= torch.arange(start, S)[:, None]).repeat(G, 1)
        # The residual stream stays float32 and only matmul inputs are cast: 30 layers of bf16
        # residual sums cost more accuracy than the 4-bit weights do, for ~2 casts per layer.
        x = F.embedding(ids, self.embed).float()  # [T, dim]
        for layer, ck, cv in zip(self.layers, self.cache_k, self.cache_v, strict=True):
            q, k, v = self._qkv(layer, x, cos, sin)
            ck[slot, :, start:S] = k.transpose(0, 1)
            cv[slot, :, start:S] = v.transpose(0, 1)
            keys, values = ck[slot : slot + 1, :, :S], cv[slot : slot + 1, :, :S]
            if causal:  # a long fresh prompt: causal SDPA skips the masked half; GQA by repeating K/V
                o = F.scaled_dot_product_attention(
                    q.transpose(0, 1)[None],
                    keys.repeat_interleave(G, 1),
                    values.repeat_interleave(G, 1),
                    is_causal=True,
                )
                o = o[0].transpose(0, 1).reshape(T, H * hd)
            else:  # each KV head read once for its G query heads (mask rows ordered (g, t), as built above)
                o = grouped_attention(q[None], keys, values, mask)[0]
            x = x + layer.wo(o)
            x = x + self._ffn(layer, x)
        return self._logits(F.rms_norm(x[-1:], (cfg.dim,), self.norm, cfg.norm_eps))[0]

    @torch.inference_mode()
    def decode(self, tokens: list[int], slots: list[int], starts: list[int]) -> Tensor:
        """One decode step of several conversations at once: token ``b`` at position ``starts[b]``
        of slot ``slots[b]``; float32 logits [B, vocab].

        Why: a decode step reads every weight for one row, and the int4 kernel's cost grows far
        slower than its rows (four rows cost a small multiple of one), so calls decoding at
        the same time share the weight reads. Attention stays per conversation (each its own
        slot and length). Each row equals :meth:`forward` of that token alone.
        """
        B = len(tokens)
        if not B == len(slots) == len(starts) or len(set(slots)) != B:
            raise ValueError(f"decode needs one token, one distinct slot and one position per row: {slots}, {starts}")
        if B == 1:
            return self.forward(tokens, slots[0], starts[0])[None]
        if max(starts) >= self.max_len:
            raise ValueError(f"a position of {starts} does not fit a {self.max_len}-token cache")
        pos = torch.as_tensor(starts, dtype=torch.long)
        cos, sin = self.cos[pos], self.sin[pos]  # [B, 1, hd]
        x = F.embedding(torch.as_tensor(tokens, dtype=torch.long), self.embed).float()  # [B, dim]
        for layer, ck, cv in zip(self.layers, self.cache_k, self.cache_v, strict=True):
            q, k, v = self._qkv(layer, x, cos, sin)
            rows = []
            for b, (slot, at) in enumerate(zip(slots, starts, strict=True)):
                ck[slot, :, at] = k[b]
                cv[slot, :, at] = v[b]
                keys, values = ck[slot : slot + 1, :, : at + 1], cv[slot : slot + 1, :, : at + 1]
                rows.append(grouped_attention(q[b : b + 1][None], keys, values, None)[0])
            x = x + layer.wo(torch.cat(rows))
            x = x + self._ffn(layer, x)
        return self._logits(F.rms_norm(x, (self.cfg.dim,), self.norm, self.cfg.norm_eps))

    @torch.inference_mode()
    def branches(self, branches: list[list[int]], slot: int, start: int) -> Tensor:
        """Several continuations of one cached prefix in one pass: float32 logits of each
        branch's last token [B, vocab]; the cache is not written (positions ``>= start`` of
        ``slot`` are left as they were).

        Why: a short read's time is mostly the weights read once per layer, not its rows (see
        :meth:`decode`), so reads that arrive together (several calls pausing at once, each asking
        the turn judge about its caller's words) cost little more as one pass than one of them
        alone, where a lock would queue them. Each branch sits at positions ``start..`` and sees
        the ``start`` cached positions and its own earlier tokens only; each row is what
        :meth:`forward` of that branch alone gives, to the kernels' rounding (the int4 kernel's
        sums run over another number of rows).
        """
        lens = [len(b) for b in branches]
        if not lens or min(lens) == 0 or start + max(lens) > self.max_len or start < 0:
            raise ValueError(f"branches of {lens} tokens at {start} do not fit a {self.max_len}-token cache")
        cfg = self.cfg
        G = cfg.groups
        ids = torch.as_tensor([t for b in branches for t in b], dtype=torch.long)
        T = ids.shape[0]
        pos = torch.cat([torch.arange(start, start + n) for n in lens])
        owner = torch.repeat_interleave(torch.arange(len(lens)), torch.as_tensor(lens))
        own = (owner[:, None] == owner[None, :]) & (pos[None, :] <= pos[:, None])  # [T, T]
        mask = torch.cat([torch.ones(T, start, dtype=torch.bool), own], dim=1).repeat(G, 1)  # rows (g, t)
        cos, sin = self.cos[pos], self.sin[pos]  # [T, 1, hd]
        x = F.embedding(ids, self.embed).float()
        for layer, ck, cv in zip(self.layers, self.cache_k, self.cache_v, strict=True):
            q, k, v = self._qkv(layer, x, cos, sin)
            keys = torch.cat([ck[slot : slot + 1, :, :start], k.transpose(0, 1)[None]], dim=2)
            values = torch.cat([cv[slot : slot + 1, :, :start], v.transpose(0, 1)[None]], dim=2)
            x = x + layer.wo(grouped_attention(q[None], keys, values, mask)[0])
            x = x + self._ffn(layer, x)
        last = torch.as_tensor(lens).cumsum(0) - 1
        return self._logits(F.rms_norm(x[last], (cfg.dim,), self.norm, cfg.norm_eps))

    @torch.inference_mode()
    def shift(self, slot: int, src: int, dst: int, n: int) -> None:
        """Move cached positions ``src..src+n`` of ``slot`` to ``dst..dst+n`` (``dst < src``).

        What lets a conversation drop old turns without re-reading the rest: a key is stored
        rotated by its absolute position (RoPE), and rotations compose, so rotating the stored
        key back by ``src - dst`` positions gives the key at its new position; values carry no
        position. Layer 0's keys come out as a fresh prefill's would; deeper layers keep what
        the moved tokens saw when they were first read (the dropped turns included), as
        llama.cpp's context shift does. Cost: one pass over the moved part of the cache.
        """
        if not 0 <= dst < src or src + n > self.max_len or n < 1:
            raise ValueError(f"cannot move {n} cached positions from {src} to {dst} in a {self.max_len}-token cache")
        delta = src - dst
        cos = self.cos[delta].float()  # [1, hd]: the angle of ``delta`` positions, per frequency
        sin = self.sin[delta].float()
        for ck, cv in zip(self.cache_k, self.cache_v, strict=True):
            k = ck[slot, :, src : src + n].float()  # [KV, n, hd]; a copy, so overlapping ranges are safe
            ck[slot, :, dst : dst + n] = (k * cos - rotate_half(k) * sin).to(self.dtype)  # rotate by -delta
            cv[slot, :, dst : dst + n] = cv[slot, :, src : src + n].clone()

    def _qkv(self, layer: Layer, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x [T, dim]`` -> q [T, H, hd], k and v [T, KV, hd], q and k rotated to their positions."""
        cfg = self.cfg
        H, KV, hd, T = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, x.shape[0]
        h = F.rms_norm(x, (cfg.dim,), layer.attn_norm, cfg.norm_eps).to(self.dtype)
        q, k, v = layer.wqkv(h).split([H * hd, KV * hd, KV * hd], dim=-1)
        q, k = q.view(T, H, hd), k.view(T, KV, hd)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v.view(T, KV, hd)

    def _ffn(self, layer: Layer, x: Tensor) -> Tensor:
        h = F.rms_norm(x, (self.cfg.dim,), layer.ffn_norm, self.cfg.norm_eps).to(self.dtype)
        gate, up = layer.w13(h).chunk(2, dim=-1)
        return layer.w2(F.silu(gate) * up)

    def _logits(self, last: Tensor) -> Tensor:
        """``last [B, dim]`` (normed) -> float32 logits [B, vocab]: the tied head, int8 when quantised."""
        return F.linear(last, self.embed) if self.head_q is None else self._head(last)

    def _head(self, last: Tensor) -> Tensor:
        """``last [B, dim]`` -> logits [B, vocab] from the int8 head, the best ``REFINE`` of them recomputed in float32.

        The fast kernel returns bf16 (its activation dtype): at logit magnitudes of ~30 that is
        a 0.125-0.25 grid, on which the top two candidates often tie exactly and greedy
        decoding would pick by token id. Recomputing the leading candidates from the same int8
        rows in float32 costs ~64 x 576 multiply-adds.
        """
        coarse = torch.ops.aten._weight_int8pack_mm(last.to(self.dtype), self.head_q, self.head_scale).float()
        for row, x in zip(coarse, last, strict=True):  # [B, vocab]: each row's leaders refined
            top = row.topk(REFINE).indices
            row[top] = (self.head_q[top].float() @ x) * self.head_scale_f32[top]
        return coarse


def load_hf_weights(directory: Path) -> tuple[LlamaConfig, dict[str, Weight]]:
    """An HF Llama directory (``config.json`` + ``*.safetensors``) as float32 weights."""
    from safetensors.torch import load_file

    try:
        cfg = check_runnable(LlamaConfig.from_hf(json.loads((directory / "config.json").read_text())))
    except (OSError, KeyError, ValueError) as exc:
        raise ModelFormatError(f"{directory}: no usable config.json ({exc})") from None
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{directory} holds no *.safetensors weights")
    weights: dict[str, Weight] = {}
    for f in files:
        weights.update({k: v.float() for k, v in load_file(f).items() if k != hf_names.LM_HEAD})
    return cfg, weights
