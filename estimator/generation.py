"""Generation sizing (``estimate(mode="generate")``, ``--mode generate``): the two steps of transformers'
``generate()`` that bound its memory, each traced on fake tensors (:mod:`estimator.capture.generate`):

* the **prefill**: the prompt's P tokens through the model, the KV cache filled (a DynamicCache to P
  tokens; a StaticCache allocated whole, for P + N - 1);
* the **last decode step**: one token through the model with P + N - 2 tokens cached before it and
  P + N - 1 after (the cache at its largest: generate() never feeds back the last token it makes).

Every step between holds less than the last one (a shorter cache, the same one-token activations), so
the peak of the generation is the higher of the two; the report's memory, timeline and headline are those
of that step (:attr:`GenerationData.binding`), and both peaks are stated.  The KV cache is read off the
cache object the model filled: per layer, its class (full or sliding-window), the keys' and values' shapes
(batch, key/value heads, tokens, head dimension: grouped-query attention's fewer key/value heads as the
model makes them) and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .capture import Generation, KV_CACHES, Progress, StepOptions, capture
from .errors import UserError
from .memory import Category, MemoryProfile, Snapshot

STAGES = ("prefill", "decode")


@dataclass
class GenerationStage:
    """One traced step of generate(): its peak, where it is, its FLOPs, the cache after it."""

    stage: str  # "prefill" or "decode"
    tokens: int  # tokens through the model in this step: P, or 1
    cached: int  # tokens the cache holds after it
    peak: int
    peak_at: Snapshot
    flops: int  # forward FLOPs of the step (one token's, in decode)
    kv_cache: int  # bytes of the cache at the peak
    memory: MemoryProfile = field(repr=False)
    capture: Any = field(repr=False)
    tally: Any = field(repr=False)
    time_s: float | None = None  # on the GPU sized for (estimator.timing), else None

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "cached": self.cached, "peak": self.peak, "peak_phase": self.peak_at.phase,
                "peak_module": self.peak_at.module, "peak_op": self.peak_at.op, "flops": self.flops,
                "kv_cache": self.kv_cache, "time_s": self.time_s}


@dataclass
class GenerationData:
    """The generation's numbers: what is generated, the cache, the two steps."""

    prompt_len: int
    new_tokens: int
    batch: int
    cache: str  # "dynamic" or "static"; "none": the model's generation config has use_cache=False
    cache_class: str  # transformers' class: DynamicCache, StaticCache
    layers: list[dict[str, Any]]  # the cache at the last decode step, one row per layer (see capture.generate)
    stages: dict[str, GenerationStage]
    binding: str  # the stage with the higher peak: the report's memory is its
    query_heads: int | None = None  # the model's attention heads (the cache keeps its key/value heads)

    @property
    def cache_len(self) -> int:
        return self.prompt_len + self.new_tokens - 1

    @property
    def state_layers(self) -> int:
        """Layers whose cache is a linear-attention layer's fixed-size states (a state-space model's, a hybrid's)."""
        return sum("states" in r for r in self.layers)

    @property
    def states_only(self) -> bool:
        """The whole cache is fixed-size states (Mamba): no keys and values grow with the tokens."""
        return bool(self.layers) and all("states" in r and "keys" not in r for r in self.layers)

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the cache at its largest (the last decode step: P + N - 1 tokens)."""
        return sum(r["bytes"] for r in self.layers)

    @property
    def kv_by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.layers:
            out[r["dtype"]] = out.get(r["dtype"], 0) + r["bytes"]
        return out

    @property
    def tokens_per_s(self) -> float | None:
        """Decode throughput on the GPU: batch / the last decode step's time (the slowest step of the decode)."""
        t = self.stages["decode"].time_s if "decode" in self.stages else None
        return self.batch / t if t else None

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_len": self.prompt_len, "new_tokens": self.new_tokens, "batch": self.batch,
                "cache": self.cache, "cache_class": self.cache_class, "cache_len": self.cache_len,
                "kv_cache": self.kv_cache_bytes, "kv_cache_by_dtype": self.kv_by_dtype,
                "kv_cache_layers": [dict(r) for r in self.layers], "binding": self.binding,
                "query_heads": self.query_heads, "stages": {name: s.to_dict() for name, s in self.stages.items()},
                "tokens_per_s": self.tokens_per_s}


_TEXT_INPUTS = ("input_ids", "attention_mask", "position_ids", "token_type_ids", "labels")


def prompt_inputs(inputs: Any, prompt_len: int | None) -> tuple[dict[str, Any], int]:
    """generate()'s input: the prompt's token ids (batch x P integers), from ``inputs`` (a tensor, or a dict
    with ``input_ids``; labels and masks are dropped: generate() makes its own mask), ``prompt_len`` replacing
    their length (zeros on the meta device)."""
    import torch

    ids = inputs.get("input_ids") if isinstance(inputs, dict) else inputs if isinstance(inputs, torch.Tensor) else None
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.is_floating_point():
        raise UserError("mode='generate' takes the prompt's token ids: a batch x length integer tensor, or a dict "
                        "with input_ids")
    media = sorted(k for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in _TEXT_INPUTS) \
        if isinstance(inputs, dict) else []
    if media:  # (a vision- or audio-language model: generate() would encode them into the prompt first)
        raise UserError(f"mode='generate' sizes text generation from the prompt's token ids; this model's inputs also "
                        f"hold {', '.join(media)}, which generate() would encode into the prompt: size the forward "
                        f"with mode='inference' (--mode inference)")
    if prompt_len is not None:
        if prompt_len < 1:
            raise UserError(f"prompt_len must be >= 1, not {prompt_len}")
        if prompt_len != ids.shape[1]:
            ids = torch.zeros(ids.shape[0], prompt_len, dtype=ids.dtype, device="meta")
    return {"input_ids": ids}, int(ids.shape[1])


def _past_positions(model, gen: Generation, exc: UserError) -> UserError:
    """``exc``, or where the prompt and the new tokens run past the model's positions (a position table indexed
    past its rows, as the real generate() fails): what to shorten."""
    from .plan.search import position_limit

    limit = position_limit(model)
    last = gen.prompt_len + gen.new_tokens - 1  # the last token generate() feeds back sits at position P + N - 2
    if limit is None or last <= limit[0] or "generate() runs past" in str(exc):
        return exc
    failed = str(exc).split("; ")[0]
    return UserError(f"generate() runs past the model's positions: a prompt of {gen.prompt_len} tokens and "
                     f"{gen.new_tokens} new ones take positions 0 to {last - 1}, more than its {limit[0]:,} "
                     f"({limit[1]}), and a real run fails there too ({failed}); use a shorter prompt or fewer new "
                     f"tokens")


def trace_generation(model, inputs: Any, options: StepOptions, *, prompt_len: int | None, new_tokens: int | None,
                     kv_cache: str, device: str, trace: str, progress: Progress, gpu: Any = None):
    """The prefill and the last decode step of ``model.generate()`` (see the module doc).  Returns the binding
    step's (capture, tally, memory profile) and the :class:`GenerationData`."""
    from .memory import simulate
    from .tally import tally

    if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or new_tokens < 1:
        raise UserError(f"mode='generate' needs new_tokens, the tokens generated after the prompt (an integer "
                        f">= 1), not {new_tokens!r}")
    if kv_cache not in KV_CACHES:
        raise UserError(f"kv_cache must be one of {', '.join(KV_CACHES)}, not {kv_cache!r}")
    from .capture.generate import check_generative

    check_generative(model)  # (an encoder-decoder's inputs are not a prompt: say what the model is first)
    kv_cache, cache_note = _configured_cache(model, kv_cache)
    padding_note = _padding_note(inputs)
    prompt, p = prompt_inputs(inputs, prompt_len)
    stages: dict[str, GenerationStage] = {}
    last = None
    for stage in STAGES if new_tokens > 1 else STAGES[:1]:  # one new token: generate() runs the prefill alone
        gen = Generation(p, new_tokens, kv_cache, stage)

        def said(what: str, detail: str = "", stage=stage) -> None:
            progress(f"{what} ({stage})", detail)

        try:
            cap = capture(model, prompt, replace(options, generation=gen), mode=trace, progress=said)
        except UserError as exc:
            raise _past_positions(model, gen, exc) from exc
        said("counting FLOPs and bytes")
        t = tally(cap, train=False)
        said("simulating memory")
        prof = simulate(cap, device, target=options.cuda)
        time_s = None
        if gpu is not None and device == "cuda":
            from .timing import step_time

            time_s = step_time(cap, gpu).total
        stages[stage] = GenerationStage(
            stage=stage, tokens=cap.generation["tokens"], cached=cap.generation["cached"], peak=prof.peak,
            peak_at=prof.peak_at, flops=t.flops["forward"],
            kv_cache=prof.peak_at.by_category.get(Category.KV_CACHE, 0), memory=prof, capture=cap, tally=t,
            time_s=time_s)
        last = cap
    binding = max(stages, key=lambda s: (stages[s].peak, s == "decode"))
    data = GenerationData(prompt_len=p, new_tokens=new_tokens, batch=last.generation["batch"],
                          cache=last.generation["cache"],
                          cache_class=last.generation["cache_class"], layers=last.generation["layers"],
                          stages=stages, binding=binding,
                          query_heads=getattr(model.config.get_text_config(decoder=True), "num_attention_heads", None))
    b = stages[binding]
    b.capture.assumptions.extend(n for n in [_search_note(model), cache_note, padding_note]
                                 if n and n not in b.capture.assumptions)
    return b.capture, b.tally, b.memory, data


def _configured_cache(model: Any, kv_cache: str) -> tuple[str, str | None]:
    """The cache a bare ``generate()`` builds: the model's ``generation_config.cache_implementation`` (a checkpoint
    may ship "static") where ``kv_cache`` is the default; sized with a DynamicCache it read 0.93x a real run's
    peaks. And the note saying so."""
    asked = getattr(getattr(model, "generation_config", None), "cache_implementation", None)
    if kv_cache != "dynamic" or asked not in ("static", "offloaded_static"):
        return kv_cache, None
    return "static", (f"the model's generation_config asks for cache_implementation={asked!r}, which a bare "
                      f"generate() builds: sized with a StaticCache" + (" (offloaded: its layers are on the host "
                      "between uses, counted here on the GPU)" if asked == "offloaded_static" else "")
                      + "; set generation_config.cache_implementation = None for the DynamicCache")


def _padding_note(inputs: Any) -> str | None:
    """A note where the given ``attention_mask`` pads some prompts (left padding): the prompt is sized unpadded,
    without the 4-D mask transformers builds once a position is masked (batch x P^2 bytes at the prefill)."""
    import torch

    mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
    if not isinstance(mask, torch.Tensor) or mask.device.type == "meta" or mask.ndim != 2 or bool(mask.all()):
        return None
    b, p = mask.shape
    return (f"the attention_mask pads some prompts: sized unpadded (generate() then builds a {b} x 1 x {p} x {p} mask, "
            f"{b * p * p:,} bytes in bool, and attention may take a slower path), so the prefill's peak may read low")


def _search_note(model: Any) -> str | None:
    """What the model's ``generation_config`` asks of ``generate()`` beyond the greedy search sized here (checkpoints
    ship beam search or sampling in it; a bare ``generate()`` call runs what it asks)."""
    config = getattr(model, "generation_config", None)
    beams, sample = getattr(config, "num_beams", 1) or 1, getattr(config, "do_sample", False)
    if beams > 1:
        return (f"the model's generation_config asks for beam search (num_beams={beams}), which a bare generate() "
                f"runs: sized here as greedy search (one sequence per prompt); beam search holds {beams} sequences "
                f"and their caches per prompt (about {beams}x the cache), pass num_beams=1 to generate() for this "
                f"figure")
    sequences = getattr(config, "num_return_sequences", 1) or 1
    if sample and sequences > 1:
        return (f"the model's generation_config asks for sampling with num_return_sequences={sequences}: sized as "
                f"greedy search of one sequence per prompt; generate() expands the batch {sequences}x (about "
                f"{sequences}x the cache and the logits), pass num_return_sequences=1 for this figure")
    if sample:
        return ("the model's generation_config asks for sampling (do_sample=True): sized as greedy search, whose "
                "cache and logits are the same; sampling adds the logits' softmax and top-k/top-p temporaries (each "
                "a batch x vocabulary array in fp32)")
    return None
