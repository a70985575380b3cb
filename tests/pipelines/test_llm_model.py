"""Our SmolLM2 runtime on the real GGUF: weights, prompts and the conversation KV cache.

References: gguf's own de-quantiser for the weights, transformers for the chat template and for
greedy decoding on the same float32 weights, and a full recompute (no cache) for every cached turn.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llama import Sampling
from pipelines.llm_chat import ChatEngine, DecodeStep, StreamDecoder, repeats_itself
from pipelines.llm_model import (
    ALIGN,
    CAUSAL_MIN_ROWS,
    INT4_MAX_ROWS,
    Llama,
    dense,
    dense_dtype,
    native_bf16,
    prepare,
    read_gguf,
)
from pipelines.local_llm import LocalLLM, bundled_gguf

pytestmark = pytest.mark.timeout(600)

SYSTEM = {"role": "system", "content": "Answer in one short sentence."}
PROMPTS = ["What is the capital of France?", "Tell me a joke about cats.", "How do I reset my password?"]


@pytest.fixture(scope="module")
def llm() -> LocalLLM:
    model = LocalLLM()
    model.load(progress=print)
    return model


@pytest.fixture(scope="module")
def gguf_weights():
    return read_gguf(bundled_gguf())


@pytest.fixture(scope="module")
def fp32(gguf_weights) -> ChatEngine:
    cfg, weights, _ = gguf_weights
    return ChatEngine(Llama(cfg, prepare(cfg, weights, "fp32"), slots=2, max_len=1024))


def test_weights_equal_ggufs_own_dequantisation(gguf_weights) -> None:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    _, weights, _ = gguf_weights
    tensors = {t.name: t for t in GGUFReader(str(bundled_gguf())).tensors}
    for gguf_name, ours in [
        ("blk.7.ffn_up.weight", "model.layers.7.mlp.up_proj.weight"),  # Q4_1
        ("blk.7.attn_v.weight", "model.layers.7.self_attn.v_proj.weight"),  # Q4_1, not permuted
        ("token_embd.weight", "model.embed_tokens.weight"),  # Q8_0
    ]:
        t = tensors[gguf_name]
        rows = slice(0, 256)  # rows of whole blocks: enough to check the layout, cheap for the embedding
        expected = dequantize(t.data[rows], t.tensor_type)
        np.testing.assert_array_equal(dense(weights[ours]).numpy()[rows], expected)


def test_chat_prompt_equals_transformers_apply_chat_template(llm: LocalLLM) -> None:
    from transformers import AutoTokenizer

    source = bundled_gguf()
    reference = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    conversations = [
        [{"role": "user", "content": "Hi there!"}],  # no system message: the template adds its own
        [SYSTEM, {"role": "user", "content": "What's 12 + 30? Café, naïve, 😀."}],
        [
            SYSTEM,
            {"role": "user", "content": "Where is my order?"},
            {"role": "assistant", "content": "It shipped yesterday."},
            {"role": "user", "content": "  When will it arrive?\n"},
        ],
    ]
    for messages in conversations:
        expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert llm.tokenizer.render(messages) == expected
        ids = reference(expected, add_special_tokens=False)["input_ids"]
        assert llm.tokenizer.encode_chat(messages) == ids


def test_stream_decoder_never_splits_a_character(llm: LocalLLM) -> None:
    tok = llm.tokenizer.tokenizer
    text = "Café crème, naïve façade — 😀 🎉 ok! 東京"
    ids = tok.encode(text, add_special_tokens=False).ids
    decoder = StreamDecoder(tok)
    pieces = [decoder.push(i) for i in ids]
    assert "".join(pieces) == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    assert sum(1 for p in pieces if p == "") > 0  # the emoji's bytes span tokens: some pushes wait


def _hf_greedy(model, ids: list[int], n: int, *, penalty: float) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
            repetition_penalty=penalty,
            pad_token_id=2,
        )
    return out[0, len(ids) :].tolist()


def test_fp32_greedy_matches_transformers_on_the_same_weights(gguf_weights, fp32: ChatEngine, llm) -> None:
    """Our forward (rope layout, GQA folding, tied head, repetition penalty) against transformers'."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg, weights, _ = gguf_weights
    reference = LlamaForCausalLM(LlamaConfig(**cfg.to_hf())).eval()
    state = {k: dense(v) for k, v in weights.items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    reference.load_state_dict(state, strict=True)
    ids = llm.tokenizer.encode_chat([SYSTEM, {"role": "user", "content": PROMPTS[0]}])
    expected = _hf_greedy(reference, ids, 8, penalty=1.1)
    with torch.inference_mode():
        ref_logits = reference(torch.tensor([ids])).logits[0, -1]
    fp32.reset()
    ours = list(fp32.generate(ids, Sampling(max_tokens=8), eos_ids=frozenset()))
    assert ours == expected
    fp32.reset()
    logits = fp32.model.forward(ids, 0, 0)
    assert torch.allclose(logits, ref_logits, atol=2e-3), (logits - ref_logits).abs().max()
    # A long fresh prompt takes the causal-SDPA path; a chunk after it the masked one.
    story = [SYSTEM, {"role": "user", "content": "Tell me about the sea. " * 60}]
    long_ids = llm.tokenizer.encode_chat(story)
    assert len(long_ids) > CAUSAL_MIN_ROWS
    with torch.inference_mode():
        ref_long = reference(torch.tensor([long_ids + ids[-20:]])).logits[0]
    logits = fp32.model.forward(long_ids, 0, 0)
    assert torch.allclose(logits, ref_long[len(long_ids) - 1], atol=2e-3)
    logits = fp32.model.forward(ids[-20:], 0, len(long_ids))
    assert torch.allclose(logits, ref_long[-1], atol=2e-3)


def test_int4_serving_model_starts_like_the_fp32_reference(llm: LocalLLM, fp32: ChatEngine) -> None:
    """The serving model keeps the GGUF's 4-bit codes but rounds scales to bf16, runs bf16
    activations and an int8 head, so long greedy continuations may part; the first words must not."""
    eos = llm.tokenizer.eos_ids
    for prompt in PROMPTS:
        ids = llm.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        llm.engine.reset()
        fp32.reset()
        fast = list(llm.engine.generate(ids, Sampling(max_tokens=4), eos_ids=eos))
        reference = list(fp32.generate(ids, Sampling(max_tokens=4), eos_ids=eos))
        assert fast == reference, (
            prompt,
            llm.tokenizer.tokenizer.decode(fast),
            llm.tokenizer.tokenizer.decode(reference),
        )


def test_the_prefill_copy_follows_the_cpu_and_both_dtypes_read_alike(llm: LocalLLM) -> None:
    """``dense="auto"`` keeps the prefill matrices in bf16 only where the CPU multiplies bf16
    natively (an AVX2-only CPU emulates it several times slower than float32); whichever dtype
    runs, a prompt longer than the int4 kernel's rows must read the same."""
    assert dense_dtype("auto") == ("bf16" if native_bf16() else "fp32")
    assert llm.engine.model.dense == dense_dtype("auto")
    with pytest.raises(ValueError, match="dense 'fp16': use one of auto, bf16, fp32"):
        dense_dtype("fp16")
    model = llm.engine.model
    ids = llm.tokenizer.encode_chat([SYSTEM, {"role": "user", "content": PROMPTS[2]}])
    assert len(ids) > INT4_MAX_ROWS  # the dense path runs
    logits = {}
    for kind in ("bf16", "fp32"):
        other = Llama(model.cfg, dict(model.tensors), slots=1, max_len=256, dense=kind)
        assert other.dense == kind
        assert other.layers[0].w13.weight.dtype == (torch.float32 if kind == "fp32" else torch.bfloat16)
        logits[kind] = other.forward(ids, 0, 0)
    assert int(logits["bf16"].argmax()) == int(logits["fp32"].argmax())
    top = logits["fp32"].topk(5).indices
    pair = logits["bf16"][top], logits["fp32"][top]
    assert torch.allclose(*pair, atol=1.0), pair


def test_batched_decode_steps_equal_one_conversation_at_a_time(llm: LocalLLM) -> None:
    """Calls decoding at once share one :meth:`Llama.decode` per step (the server's worker does
    this); each conversation's tokens must be the ones it gets alone. Prompts with no common
    prefix, so that both runs read every prompt whole."""
    engine, enc = llm.engine, llm.tokenizer.tokenizer.encode
    prompts = [enc(t).ids for t in ("The capital of France is", "Once upon a time there was", "My favourite colour")]
    assert len({p[0] for p in prompts}) == len(prompts)
    engine.reset()
    alone = [list(engine.generate(p, Sampling(max_tokens=12), eos_ids=frozenset())) for p in prompts]
    engine.reset()
    gens = [engine.generate(p, Sampling(max_tokens=12), eos_ids=frozenset(), batched=True) for p in prompts]
    together: list[list[int]] = [[] for _ in prompts]
    inbox: list[torch.Tensor | None] = [None] * len(prompts)
    live, sizes = set(range(len(prompts))), []
    while live:
        steps = []
        for i in sorted(live):
            try:
                item = gens[i].send(inbox[i]) if inbox[i] is not None else next(gens[i])
            except StopIteration:
                live.discard(i)
                continue
            inbox[i] = None
            if isinstance(item, DecodeStep):
                steps.append((i, item))
                item = item.token
            together[i].append(item)
        if steps:
            sizes.append(len(steps))
            logits = engine.model.decode(
                [s.token for _, s in steps], [s.slot for _, s in steps], [s.position for _, s in steps]
            )
            for (i, _), row in zip(steps, logits, strict=True):
                inbox[i] = row
    assert together == alone
    assert max(sizes) == len(prompts) and all(len(t) == 12 for t in together)
    with pytest.raises(ValueError, match="one distinct slot"):
        engine.model.decode([1, 2], [0, 0], [5, 6])


def test_every_weight_the_kernels_read_is_aligned_and_four_calls_decode_together(llm: LocalLLM) -> None:
    """The int8 head, a view into the cached safetensors file 40 bytes past a cache line, crashed
    the LLM server (SIGSEGV in ``_weight_int8pack_mm``) at its first decode step of four
    conversations at once on AVX-512 CPUs: four calls at once restarted it. The model copies any
    weight that does not start on a 64-byte boundary, and four rows decode."""
    model = llm.engine.model
    assert all(t.data_ptr() % ALIGN == 0 for t in model.tensors.values())
    tensors = dict(model.tensors)
    head = tensors["head.q"]
    raw = torch.empty(head.numel() + 40, dtype=head.dtype)
    tensors["head.q"] = raw[40:].view(head.shape)  # as the file's mapping placed it
    tensors["head.q"].copy_(head)
    assert tensors["head.q"].data_ptr() % ALIGN
    other = Llama(model.cfg, tensors, slots=4, max_len=64)
    assert other.head_q.data_ptr() % ALIGN == 0 and torch.equal(other.head_q, head)
    for slot in range(4):
        other.forward([1, 2, 3 + slot], slot, 0)
    logits = other.decode([5, 6, 7, 8], [0, 1, 2, 3], [3, 3, 3, 3])
    assert logits.shape == (4, model.cfg.vocab_size) and torch.isfinite(logits).all()
    for b in range(4):  # each row is its conversation's own
        assert int(logits[b].argmax()) == int(other.forward([5 + b], b, 3).argmax())


def _reply(engine: ChatEngine, llm: LocalLLM, messages) -> list[int]:
    ids = llm.tokenizer.encode_chat(messages)
    return list(engine.generate(ids, Sampling(max_tokens=16), eos_ids=llm.tokenizer.eos_ids))


def _conversations(engine: ChatEngine, llm: LocalLLM, check) -> None:
    """Four turns of one conversation (one reply cut short as after a barge-in) interleaved with
    a second one that shares the system prompt; ``check(messages)`` after each cached turn."""
    engine.reset()
    decode = llm.tokenizer.tokenizer.decode
    a, b = [SYSTEM], [SYSTEM]
    asks_a = ["Where is my order?", "When will it arrive?", "Can I change the address?", "Thanks, bye."]
    asks_b = ["What is two plus two?", "And times three?"]
    for turn, ask in enumerate(asks_a):
        a.append({"role": "user", "content": ask})
        reply = check(a)
        if turn:
            stats = engine.last
            assert stats.reused_tokens > stats.prompt_tokens // 2, stats  # only the new tokens ran
        text = decode(reply)
        if turn == 1:
            text = " ".join(text.split()[:3])  # the caller interrupted: only what was played is kept
        a.append({"role": "assistant", "content": text})
        if turn < len(asks_b):  # another caller meanwhile; it must not evict the first one's cache
            b.append({"role": "user", "content": asks_b[turn]})
            b.append({"role": "assistant", "content": decode(check(b))})


def test_cached_turns_equal_a_full_recompute_token_for_token(llm: LocalLLM, fp32: ChatEngine) -> None:
    """On the float32 model, where the only difference between the two paths is the cache."""
    m = fp32.model
    full = ChatEngine(Llama(m.cfg, m.tensors, slots=1, max_len=m.max_len))

    def check(messages) -> list[int]:
        cached = _reply(fp32, llm, messages)
        full.reset()
        assert cached == _reply(full, llm, messages), messages
        return cached

    _conversations(fp32, llm, check)


def test_the_next_turns_opening_read_ahead_is_reused_and_changes_no_token(llm: LocalLLM, fp32: ChatEngine) -> None:
    """The template's next-turn opening, read into the slot once a reply has ended, is the start
    of the next prompt: that turn reads only the caller's words and the assistant's header, and
    its reply is the one a full recompute gives (float32, where only the cache differs). A reply
    cut by a barge-in leaves the read-ahead unused: the prompt no longer continues that way."""
    tok = llm.tokenizer
    opening = tok.turn_opening()
    assert [tok.tokenizer.id_to_token(i) for i in opening] == ["<|im_end|>", "Ċ", "<|im_start|>", "user", "Ċ"]
    m = fp32.model
    full = ChatEngine(Llama(m.cfg, m.tensors, slots=1, max_len=m.max_len))
    fp32.reset()
    messages = [SYSTEM, {"role": "user", "content": PROMPTS[0]}]
    first = tok.encode_chat(messages)
    reply = list(fp32.generate(first, Sampling(max_tokens=40), eos_ids=tok.eos_ids))
    assert fp32.last.finish_reason == "stop" and reply, tok.tokenizer.decode(reply)  # its end token came
    assert fp32.read_ahead(fp32.last.slot, opening)
    for kept in (reply, reply[:2]):  # heard whole; cut after two tokens (then nothing is read ahead)
        history = [*messages, {"role": "assistant", "content": tok.tokenizer.decode(kept)}]
        ids = tok.encode_chat([*history, {"role": "user", "content": PROMPTS[1]}])
        second = list(fp32.generate(ids, Sampling(max_tokens=12), eos_ids=tok.eos_ids))
        full.reset()
        assert second == list(full.generate(ids, Sampling(max_tokens=12), eos_ids=tok.eos_ids))
        if kept is reply:
            assert ids[: len(first) + len(reply) + len(opening)] == first + reply + opening
            assert fp32.last.reused_tokens == len(first) + len(reply) + len(opening)
    assert not fp32.read_ahead(fp32.last.slot, [0] * fp32.model.max_len)  # a full cache: nothing read


def test_cached_turns_of_the_serving_model_match_a_full_recompute(llm: LocalLLM) -> None:
    """The int4/bf16 model: SDPA's bf16 result depends on how many keys and queries one call
    sees, so a reply computed token by token and the same reply re-read in one prefill differ
    by ~0.1 in the leading logits and a near-tie may go either way later in a reply. What must
    hold: the next-token logits after a cached prefix equal a full recompute's within that
    noise (a wrong position or slot would be off by whole units), and the first token agrees."""
    eng = llm.engine
    m = eng.model
    full = Llama(m.cfg, m.tensors, slots=1, max_len=m.max_len)

    def check(messages) -> list[int]:
        ids = llm.tokenizer.encode_chat(messages)
        reply = list(eng.generate(ids, Sampling(max_tokens=24), eos_ids=llm.tokenizer.eos_ids))
        n = eng.last.reused_tokens
        cached = m.forward(ids[n:], eng.last.slot, n)  # recomputes the same positions: harmless
        reference = full.forward(ids, 0, 0)
        top = reference.topk(16).indices
        assert (cached[top] - reference[top]).abs().max() < 0.5
        assert int(cached.argmax()) == int(reference.argmax())
        return reply

    _conversations(eng, llm, check)


def test_a_loop_is_a_short_cycle_said_over_and_over() -> None:
    hello, comma, zero = 7, 8, 9
    assert repeats_itself([1, 2] + [hello, comma] * 4)  # "hello, hello, hello, hello,"
    assert not repeats_itself([1, 2] + [hello, comma] * 3 + [hello])
    assert repeats_itself([zero] * 8) and not repeats_itself([1] + [zero] * 7)  # "100000000" is kept whole
    cycle = [1, 2, 3, 4, 5, 6, 7, 8]
    assert repeats_itself(cycle * 4) and not repeats_itself(cycle * 3)
    assert not repeats_itself([1, 2, 3] * 3)  # "one two three one two three one two three"
    assert not repeats_itself(list(range(9)) * 4)  # longer cycles than LOOP_CYCLE are not looked for
    assert not repeats_itself([])


def test_a_reply_that_goes_round_in_a_loop_ends_there(llm: LocalLLM) -> None:
    """Greedy, without the penalty, the model echoes a repetitive prompt for as long as it is
    allowed ("hello, hello, ..." for all 40 tokens before this guard): the reply now ends once it
    has said one cycle four times, and says which way it ended."""
    eng, tok = llm.engine, llm.tokenizer.tokenizer
    eng.reset()
    for text in ("hello, hello, hello, hello, hello,", "The number is 100000000"):
        out = list(eng.generate(tok.encode(text).ids, Sampling.greedy(max_tokens=40), eos_ids=frozenset()))
        assert eng.last.looped and eng.last.finish_reason == "stop", (text, tok.decode(out))
        assert len(out) == eng.last.completion_tokens <= 8, tok.decode(out)
        assert repeats_itself(out) and not repeats_itself(out[:-1])
    # a reply that does not loop is as long as it was
    eng.reset()
    ids = llm.tokenizer.encode_chat([SYSTEM, {"role": "user", "content": "Write a long story about the sea."}])
    out = list(eng.generate(ids, Sampling(max_tokens=40), eos_ids=llm.tokenizer.eos_ids))
    assert not eng.last.looped and len(out) == 40, tok.decode(out)


def test_a_stopped_generation_leaves_a_consistent_cache(llm: LocalLLM) -> None:
    """Closing the generator mid-reply (a cut stream) keeps only tokens whose keys were written."""
    eng = llm.engine
    eng.reset()
    messages = [SYSTEM, {"role": "user", "content": "Write a long story about the sea."}]
    ids = llm.tokenizer.encode_chat(messages)
    gen = eng.generate(ids, Sampling(max_tokens=100), eos_ids=llm.tokenizer.eos_ids)
    got = [next(gen) for _ in range(5)]
    gen.close()
    slot = eng.slots[eng.last.slot]
    assert slot.ids[: len(ids)] == ids and len(slot.ids) <= len(ids) + len(got)
    # The same request again reuses all of it and produces the same first tokens.
    again = list(eng.generate(ids, Sampling(max_tokens=5), eos_ids=llm.tokenizer.eos_ids))
    assert again == got and eng.last.reused_tokens == len(ids) - 1


def test_a_hugging_face_llama_directory_runs_like_transformers(tmp_path, llm: LocalLLM) -> None:
    """``--model DIR``: a tiny random Llama saved by transformers, with SmolLM2's tokenizer."""
    import shutil
    from dataclasses import replace

    from transformers import LlamaConfig, LlamaForCausalLM

    from pipelines.llm_model import SMOLLM2_135M

    shape = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "intermediate": 128}
    cfg = replace(SMOLLM2_135M, **shape, max_position=512)
    torch.manual_seed(0)
    # A wide init spreads the logits: near-ties of an untrained model would make greedy arbitrary.
    reference = LlamaForCausalLM(LlamaConfig(**cfg.to_hf(), initializer_range=0.5)).eval()
    reference.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(llm.folder / name, tmp_path / name)
    exact = LocalLLM(tmp_path, precision="fp32", slots=1, max_len=256)
    exact.load(progress=lambda *_: None)
    ids = exact.tokenizer.encode_chat([{"role": "user", "content": "Hello there"}])
    expected = _hf_greedy(reference, ids, 6, penalty=1.0)
    greedy = Sampling(max_tokens=6, repetition_penalty=1.0)
    assert list(exact.engine.generate(ids, greedy, eos_ids=frozenset())) == expected
    fast = LocalLLM(tmp_path, slots=1, max_len=256)  # int4: its matrices are rounded to Q4_1 on load
    fast.load(progress=lambda *_: None)
    assert len(list(fast.engine.generate(ids, greedy, eos_ids=frozenset()))) == 6


def test_seeded_sampling_is_reproducible(llm: LocalLLM) -> None:
    ids = llm.tokenizer.encode_chat([{"role": "user", "content": PROMPTS[1]}])
    runs = []
    for seed in (7, 7, 8):
        llm.engine.reset()
        sampling = Sampling(max_tokens=12, temperature=1.0, seed=seed)
        runs.append(list(llm.engine.generate(ids, sampling, eos_ids=llm.tokenizer.eos_ids)))
    assert runs[0] == runs[1] and runs[0]
    llm.engine.reset()
    greedy = list(llm.engine.generate(ids, Sampling(max_tokens=12), eos_ids=llm.tokenizer.eos_ids))
    assert greedy not in (runs[0], runs[2]) or runs[0] != runs[2]  # sampling is not greedy in disguise


def test_two_calls_sharing_a_long_system_prompt_keep_their_own_caches(llm: LocalLLM) -> None:
    """The demo's system prompt is most of a first turn's prompt: a second caller must branch
    off it (the shared part copied) rather than overwrite the first caller's slot."""
    eng = llm.engine
    eng.reset()
    system = {
        "role": "system",
        "content": "You are a friendly voice assistant on a phone or video call. Your replies are spoken "
        "aloud: answer in one to three short sentences of plain conversational English, with no lists, "
        "no markdown, no emoji and no special characters. If you did not understand, ask briefly.",
    }
    calls = {name: [system, {"role": "user", "content": ask}] for name, ask in (("a", "Hi!"), ("b", "Hello?"))}
    for name in ("a", "b"):
        reply = _reply(eng, llm, calls[name])
        calls[name].append({"role": "assistant", "content": llm.tokenizer.tokenizer.decode(reply)})
    assert eng.last.reused_tokens > 40  # b's first turn started from a's copy of the system prompt
    for name in ("a", "b"):
        calls[name].append({"role": "user", "content": "What can you do?"})
        _reply(eng, llm, calls[name])
        first_prompt = len(llm.tokenizer.encode_chat(calls[name][:2]))
        assert eng.last.reused_tokens > first_prompt, name  # its whole first turn came from its slot


def test_a_shifted_cache_holds_the_keys_a_fresh_read_would(llm: LocalLLM, fp32: ChatEngine) -> None:
    """``Llama.shift`` re-rotates moved keys: at layer 0 (whose keys depend only on the token and
    its position) the moved span equals a fresh prefill of the shortened sequence."""
    m = fp32.model
    tok = llm.tokenizer
    head = tok.encode_chat([SYSTEM])[:-3]  # the system turn, without the generation prompt
    dropped = tok.encode_chat([{"role": "user", "content": "Where is my order? " * 5}])[:-3]
    kept = tok.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    fp32.reset()
    m.forward(head + dropped + kept, 0, 0)
    m.shift(0, len(head) + len(dropped), len(head), len(kept))
    m.forward(head + kept, 1, 0)
    n = len(head) + len(kept)
    k0, v0 = m.cache_k[0], m.cache_v[0]
    assert torch.allclose(k0[0, :, :n], k0[1, :, :n], atol=1e-4), (k0[0, :, :n] - k0[1, :, :n]).abs().max()
    assert torch.equal(v0[0, :, :n], v0[1, :, :n])
    with pytest.raises(ValueError, match="cannot move"):
        m.shift(0, 10, 20, 5)  # only towards the start


def test_the_engine_follows_a_trimmed_conversation(llm: LocalLLM) -> None:
    """A conversation back with its oldest exchange cut out: the engine moves its cache and
    reads only the new turn; with ``follow_trims`` off it reads the trimmed history again."""
    eng, decode = llm.engine, llm.tokenizer.tokenizer.decode
    history = [SYSTEM]
    for ask in ("Where is my order?", "When will it arrive?", "Can I change the address?"):
        history.append({"role": "user", "content": ask})
        history.append({"role": "assistant", "content": decode(_reply(eng, llm, history))})
    trimmed = [SYSTEM, *history[3:], {"role": "user", "content": "Thanks, bye."}]
    ids = llm.tokenizer.encode_chat(trimmed)
    for follow in (True, False):
        eng.reset()
        _reply(eng, llm, history[:-1])  # the cache holds the last turn's prompt and reply
        eng.follow_trims = follow
        try:
            reply = _reply(eng, llm, trimmed)
        finally:
            eng.follow_trims = True
        stats = eng.last
        assert reply and stats.prompt_tokens == len(ids)
        if follow:
            assert stats.moved_tokens > 40 and stats.dropped_tokens > 10, stats
            assert stats.prompt_tokens - stats.reused_tokens < 20, stats  # only "Thanks, bye." and its frame
            slot = eng.slots[stats.slot]
            assert slot.ids[: len(ids)] == ids
        else:
            assert stats.moved_tokens == 0 and stats.reused_tokens < stats.prompt_tokens // 2, stats
