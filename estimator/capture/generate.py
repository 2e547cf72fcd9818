"""One step of transformers' ``generate()`` on traced tensors, with its KV cache: the prefill (the prompt's
P tokens through the model, the cache filled) or the last decode step (one token, the cache holding
P + N - 2 tokens before it and P + N - 1 after), as ``GenerationMixin._sample`` runs them (transformers 5.17,
``generation/utils.py``; greedy search, generate()'s default without sampling settings):

* the loop's state before the step: the sequence so far (``input_ids``, B x S int64), the attention mask
  (B x S) and the position ids (B x S) that ``_update_model_kwargs_for_generation`` grows by one column per
  step, and, in decode, the previous step's scores (``next_token_logits``, B x vocabulary float32, held until
  the new ones are assigned);
* ``prepare_inputs_for_generation`` (the last token's ids and positions, cloned), the forward with
  ``use_cache=True`` and ``logits_to_keep=1`` where the model takes it (generate sets it: only the last
  position's logits are computed);
* the token selection: the last position's logits copied to float32, ``argmax``, the sequence grown by
  ``torch.cat``; the model's outputs dropped (``del outputs``).

The cache is transformers' own class, built as ``generate()`` builds it (``_prepare_cache_for_generation``):
``DynamicCache`` (the default: each layer's keys and values grown by ``torch.cat`` at every step, the old
tensor freed once the new one is made) or ``StaticCache(max_cache_len=P + N - 1)`` (``cache_implementation=
"static"``: each layer's keys and values allocated whole, zeros, at its first update, then written in
place).  So the cache's shapes are the model's own: grouped-query attention's key/value heads, sliding-
window layers, the layer types of hybrid models, the cache dtype the compute runs in.

Before a decode step the cache is filled by running the model on the first P + N - 2 tokens (a prefill of
that length) with ops recorded in a recorder that is thrown away: the step then starts with the cache
generate() would have after N - 2 decode steps (the same shapes; a dynamic layer's tensors are the last
``torch.cat``'s), its tensors allocated before the first op.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import UserError
from .recorder import GENERATE_MODULE, Phase

KV_CACHES = ("dynamic", "static")


@dataclass(frozen=True)
class Generation:
    """What is generated (``prompt_len`` tokens in, ``new_tokens`` out), the cache class and the step traced."""

    prompt_len: int
    new_tokens: int
    cache: str = "dynamic"  # "dynamic" (DynamicCache) or "static" (StaticCache)
    stage: str = "prefill"  # "prefill" or "decode" (the last decode step)

    @property
    def cache_len(self) -> int:
        """The tokens the cache holds at the last decode step: generate()'s ``max_cache_length = max_length - 1``
        (the last token generated is never fed back), the length a StaticCache is allocated for."""
        return self.prompt_len + self.new_tokens - 1

    @property
    def cached_before(self) -> int:
        """Tokens in the cache when the traced step starts: none (prefill) or P + N - 2 (the last decode step)."""
        return 0 if self.stage == "prefill" else self.cache_len - 1

    @property
    def sequence(self) -> int:
        """Tokens of the sequence the loop holds when the step starts: the prompt, or all but the last token."""
        return self.prompt_len if self.stage == "prefill" else self.cache_len


def check_generative(model: torch.nn.Module) -> None:
    """A decoder-only transformers model with ``generate()`` and a cache, or a one-line error."""
    config = getattr(model, "config", None)
    if not hasattr(model, "prepare_inputs_for_generation") or config is None:
        raise UserError(f"mode='generate' sizes transformers' generate(): {type(model).__name__} has no "
                        f"prepare_inputs_for_generation (use an hf: SPEC or a transformers model)")
    if getattr(config, "is_encoder_decoder", False):
        raise UserError(f"mode='generate' covers decoder-only models; {type(model).__name__} is an "
                        f"encoder-decoder (its encoder runs once and a cross-attention cache is kept beside "
                        f"the decoder's): estimate its decoder with mode='inference'")
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if callable(supports) and not supports():
        raise UserError(f"mode='generate': {type(model).__name__} keeps no transformers Cache (a recurrent or "
                        f"linear-attention state): estimate one step with mode='inference'")


def make_cache(model: torch.nn.Module, gen: Generation) -> Any:
    """The cache ``generate()`` makes for this model (see the module doc), outside any fake mode (a
    StaticCache's position counter is a real integer tensor: the step reads its value)."""
    from transformers import DynamicCache, StaticCache

    config = model.config.get_text_config(decoder=True)
    if gen.cache == "static":
        return StaticCache(config=config, max_cache_len=gen.cache_len)
    return DynamicCache(config=config)


STATES = ("conv_states", "recurrent_states")  # a linear-attention (state-space) layer's fixed-size states


def cache_tensors(cache: Any) -> list[tuple[int, str, torch.Tensor]]:
    """(layer, attribute, tensor) of every tensor the cache's layers hold: keys, values and their counters, and a
    linear-attention layer's states (transformers 5 keeps them in dicts)."""
    out = []
    for i, layer in enumerate(getattr(cache, "layers", ())):
        for name, value in vars(layer).items():
            if isinstance(value, torch.Tensor):
                out.append((i, name, value))
            elif isinstance(value, dict):
                out += [(i, f"{name}[{k}]", v) for k, v in value.items() if isinstance(v, torch.Tensor)]
    return out


def _windowed(cache: Any) -> None:
    """A sliding-window layer's keys and values as a decode step leaves them: a view of the last window - 1 tokens
    of that step's ``torch.cat`` (window tokens), where the prefill that fills the cache leaves a view of all the
    tokens' storage (``DynamicSlidingWindowLayer.update``): a fresh storage of one token more than the view."""
    for layer in getattr(cache, "layers", ()):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor) and t.ndim >= 2 and t.untyped_storage().nbytes() > t.nbytes:
                fresh = t.new_empty((*t.shape[:-2], t.shape[-2] + 1, t.shape[-1]))
                setattr(layer, name, fresh[..., 1:, :])


def _state_tensors(layer: Any) -> dict[str, torch.Tensor]:
    """A linear-attention layer's states by name (``conv_states``; ``conv_states[k]`` where a dict holds several)."""
    out: dict[str, torch.Tensor] = {}
    for name in STATES:
        states = getattr(layer, name, None)
        if isinstance(states, dict):
            tensors = {k: v for k, v in states.items() if isinstance(v, torch.Tensor)}
            out.update({f"{name}[{k}]" if len(tensors) > 1 else name: v for k, v in tensors.items()})
    return out


def cache_rows(cache: Any) -> list[dict[str, Any]]:
    """One row per layer: its class, the keys' and values' shapes (batch, key/value heads, tokens, head
    dimension) and dtype, and the bytes they hold; a linear-attention layer (Mamba's, a hybrid's) its states'
    shapes (``states``: a fixed size, whatever the tokens), beside its keys and values where the layer holds
    both (Falcon-H1's attention and Mamba mixers side by side in every layer), and ``others``: the layer's other
    tensors of at least one dimension by attribute (a sparse-attention indexer's keys, a compressed cache's
    buffers: DeepSeek-V3.2-style and V4 layers).  ``bytes``: every distinct storage the layer holds, its scalar
    counters included (what it keeps in memory)."""
    rows = []
    for i, layer in enumerate(getattr(cache, "layers", ())):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        states = _state_tensors(layer)
        row: dict[str, Any] = {"layer": i, "kind": type(layer).__name__}
        named = dict((name, t) for _, name, t in cache_tensors(_One(layer)))
        if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor):
            row.update(keys=list(keys.shape), values=list(values.shape),
                       dtype=str(keys.dtype).removeprefix("torch."))
            named.pop("keys", None), named.pop("values", None)
        if states:
            row["states"] = {k: list(v.shape) for k, v in states.items()}
            row.setdefault("dtype", str(next(iter(states.values())).dtype).removeprefix("torch."))
            named = {k: v for k, v in named.items() if k not in states and k.split("[")[0] not in STATES}
        others = {k: list(t.shape) for k, t in named.items() if t.ndim >= 1 and t.numel() > 0}
        if others:
            row["others"] = others
        storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for _, _, t in cache_tensors(_One(layer))}
        row["bytes"] = sum(storages.values())
        if "keys" in row or states or others:
            if "dtype" not in row:  # (only other tensors: the first's)
                row["dtype"] = str(named[next(iter(others))].dtype).removeprefix("torch.")
            rows.append(row)
    return rows


class _One:
    """A cache of one layer, for :func:`cache_tensors`."""

    def __init__(self, layer: Any):
        self.layers = (layer,)


@contextlib.contextmanager
def _off_the_record(step: Any):
    """Run ops as the step runs them (known values, the target's kernels) but record them in a recorder that
    is then thrown away: the tensors that survive (the cache) are then new to the step's recorder."""
    rec, mode = step.rec, step.fake_mode
    if mode is None:  # real tensors: outside the recorder's own dispatch mode nothing is recorded
        yield
        return
    spare = type(rec)(rec.fake)
    spare.target, spare.substitute, spare.real_sizes = rec.target, rec.substitute, rec.real_sizes
    mode.rec = spare
    try:
        with mode.recording_on():
            yield
    finally:
        mode.rec = rec


def _real(make):
    """A small integer tensor of the loop's state, made outside any fake mode (its values are read)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return make()


class GenerationStep:
    """One traced step of generate() (see the module doc) for :class:`~.step.Step` (``step``)."""

    def __init__(self, step: Any, gen: Generation):
        self.step, self.gen, self.model = step, gen, step.call
        check_generative(self.model)
        ids = next((t for t in step.flat_inputs if not (t.is_floating_point() or t.is_complex()) and t.ndim == 2), None)
        if ids is None:
            raise UserError("mode='generate' takes the prompt's token ids (batch x prompt length, integers) as "
                            "input_ids")
        self.prompt = ids  # the caller's tensor: generate()'s input_ids at the prefill, alive to the end
        self.batch = int(ids.shape[0])
        params = inspect.signature(self.model.forward).parameters
        self.positions = "position_ids" in params
        self.logits_to_keep = "logits_to_keep" in params
        self.prepare_takes = dict(inspect.signature(self.model.prepare_inputs_for_generation).parameters)
        if any(p.kind is p.VAR_KEYWORD for p in self.prepare_takes.values()):  # (Mamba's: the rest to the base's)
            from transformers import GenerationMixin

            self.prepare_takes = {**inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters,
                                  **self.prepare_takes}
        # generate() runs with its generation config's use_cache (from the model's configuration): without it no
        # cache is made and every step feeds the whole sequence so far (_sample: next_sequence_length None)
        self.use_cache = getattr(getattr(self.model, "generation_config", None), "use_cache", True) is not False
        if not self.use_cache and gen.cache == "static":
            raise UserError(f"{type(self.model).__name__}'s generation config has use_cache=False: generate() keeps "
                            f"no cache; drop --kv-cache static (kv_cache='static'), or --set use_cache=true")
        self.cache: Any = None
        self.sids: dict[str, set[int]] = {"kv_cache": set(), "input": set()}

    def _state(self, length: int) -> dict[str, Any]:
        """generate()'s model_kwargs for a sequence of ``length`` tokens with no padding: the attention mask of
        ones and the position ids ``_prepare_position_ids_for_generation`` derives from it (cumsum - 1)."""
        mask = _real(lambda: torch.ones(self.batch, length, dtype=torch.int64))
        state: dict[str, Any] = {"attention_mask": mask, "use_cache": self.use_cache}
        if self.positions:
            state["position_ids"] = _real(lambda: (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0))
        if self.logits_to_keep:
            state["logits_to_keep"] = 1
        return state

    def _forward(self, ids: torch.Tensor, state: dict[str, Any], decode: bool) -> Any:
        """prepare_inputs_for_generation and the forward, as one iteration of ``_sample`` calls them."""
        model = self.model
        extra: dict[str, Any] = {}
        if "next_sequence_length" in self.prepare_takes:  # transformers 5: _sample's, 1 with a cache
            extra["next_sequence_length"] = 1 if decode and self.use_cache else None
        else:  # transformers 4: the positions to write, as a tensor
            cached = self.cache.get_seq_length() if decode and self.cache is not None else 0
            extra["cache_position"] = _real(lambda: torch.arange(int(cached), ids.shape[1]))
        if "is_first_iteration" in self.prepare_takes:
            extra["is_first_iteration"] = not decode
        # generate() hands the cache to Mamba-named models as cache_params (_prepare_cache_for_generation)
        cache_name = "cache_params" if "mamba" in type(model).__name__.lower() else "past_key_values"
        with self._in(GENERATE_MODULE):
            inputs = model.prepare_inputs_for_generation(ids, **{cache_name: self.cache}, **state, **extra)
        return model(**inputs, return_dict=True)

    @contextlib.contextmanager
    def _in(self, module: str):
        stack = self.step.rec.module_stack
        stack.append(module)
        try:
            yield
        finally:
            stack.pop()

    def fill(self) -> None:
        """The cache as generate() has it before the last decode step: the model run on P + N - 2 tokens,
        unrecorded; its tensors become the step's (allocated before the first op)."""
        length = self.gen.cached_before
        ids = _real(lambda: torch.zeros(self.batch, length, dtype=torch.int64))
        with _off_the_record(self.step):
            try:
                out = self.step._guard(lambda: self._forward(ids, self._state(length), decode=False))
            except UserError as exc:
                if "out of bounds" not in str(exc):
                    raise
                raise UserError(f"generate() runs past the model's positions: a prompt of {self.gen.prompt_len} "
                                f"tokens and {self.gen.new_tokens} new ones take positions 0 to "
                                f"{self.gen.sequence - 1}, and a real run fails there too ({exc.__cause__ or exc}); "
                                f"use a shorter --prompt-len or fewer --new-tokens") from None
        del out
        self.step.module_outputs.clear()  # the shapes of the first call are the step's, not the fill's
        if self.gen.new_tokens >= 3:  # the step before was a decode step: _windowed (a sliding layer's cat)
            with _off_the_record(self.step):
                _windowed(self.cache)
        for layer, name, t in cache_tensors(self.cache):
            node = self.step.rec.placeholder(f"kv_cache_{layer}_{name}", t, "kv_cache", GENERATE_MODULE)
            self.sids["kv_cache"].add(node.meta["storage"][0])

    def run(self) -> tuple[Any, ...]:
        """Trace the step; returns what the loop holds after it (the cache, the sequence, the scores)."""
        step, gen, rec = self.step, self.gen, self.step.rec
        decode = gen.stage == "decode"
        with torch.no_grad(), step.opts.precision.autocast_context():
            if self.use_cache:
                self.cache = _real(lambda: make_cache(self.model, gen))
                if decode:
                    self.fill()
            length = gen.sequence
            # the sequence so far: the prompt itself at the prefill, a longer tensor later (the prompt stays alive:
            # the caller holds it)
            ids = _real(lambda: torch.zeros(self.batch, length, dtype=torch.int64)) if decode else self.prompt
            state = self._state(length)
            held = ([ids] if decode else []) + [t for t in state.values() if isinstance(t, torch.Tensor)]
            scores = self._previous_scores() if decode else None
            self._hold(held + ([scores] if scores is not None else []))
            del held
            rec.phase = Phase.FORWARD
            with step._recording():
                outputs = step._guard(lambda: self._forward(ids, state, decode))
                with self._in(GENERATE_MODULE):
                    # next_token_logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32): the previous
                    # step's scores are released once it is assigned
                    new = step._guard(lambda: outputs.logits[:, -1].to(copy=True, dtype=torch.float32))
                    scores = new
                    next_tokens = step._guard(lambda: torch.argmax(scores, dim=-1))
                    ids = step._guard(lambda: torch.cat([ids, next_tokens[:, None]], dim=-1))
                del outputs, new, next_tokens  # ``del outputs``: the logits go
        self.sids["kv_cache"] |= {rec.sid(t) for _, _, t in cache_tensors(self.cache)}
        step.loss_source = "none (generation)"
        cached = 0 if not self.use_cache else gen.sequence if decode else gen.prompt_len
        step.generation = {"stage": gen.stage, "prompt_len": gen.prompt_len, "new_tokens": gen.new_tokens,
                           "cache": gen.cache if self.use_cache else "none", "batch": self.batch,
                           "cache_class": type(self.cache).__name__ if self.use_cache else "none",
                           "cached": cached, "tokens": 1 if decode and self.use_cache else length,
                           "layers": cache_rows(self.cache)}
        step.extra_sids = self.sids
        return self.cache, ids, scores

    def _hold(self, tensors: list[torch.Tensor]) -> None:
        """The loop's state before the step: allocated before its first op (inputs), held by the loop."""
        for i, t in enumerate(tensors):
            node = self.step.rec.placeholder(f"generate_{i}", t, "input", GENERATE_MODULE)
            self.sids["input"].add(node.meta["storage"][0])

    def _previous_scores(self) -> torch.Tensor:
        """The previous step's ``next_token_logits`` (batch x vocabulary, float32), held during this one (made in
        the step's fake mode, which is active: a fake tensor, or a real one on the real-tensor fallback)."""
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        weight = getattr(head, "weight", None) if head is not None else None
        vocab = int(weight.shape[0]) if weight is not None else \
            int(self.model.config.get_text_config(decoder=True).vocab_size)
        return torch.empty(self.batch, vocab, dtype=torch.float32)
