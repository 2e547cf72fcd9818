"""A generation estimate in words (``mode="generate"``): what is generated, the KV cache per layer and
dtype (grouped-query attention's key/value heads as the model makes them), the peak of the prefill and of
the last decode step, their FLOPs and, on a GPU, their time.  Rows of the summary table every format shows.
"""

from __future__ import annotations

from ..results import ReportData
from .units import fmt_bytes, fmt_flops
from .words import NO_CACHE, STAGE_WORDS, place, stage_peak


def _shape(dims: list[int]) -> str:
    return "x".join(str(d) for d in dims)


def cache_words(report: ReportData) -> str:
    """'3.00 MiB at 639 tokens: 2 layers of DynamicLayer, keys and values 4x2x639x32 each (batch x KV heads x
    tokens x head dim), bfloat16; 2 KV heads for 8 query heads (grouped-query attention)'."""
    g = report.generation
    if g.cache == "none":
        return "none (use_cache=False)"
    groups: dict[tuple, int] = {}
    for r in g.layers:  # keys and values, a linear-attention layer's fixed-size states, or both (Falcon-H1)
        states = ", ".join(f"{k} {_shape(v)}" for k, v in r["states"].items()) if "states" in r else None
        others = ", ".join(f"{k} {_shape(v)}" for k, v in r["others"].items()) if "others" in r else None
        key = (r["kind"], _shape(r["keys"]) if "keys" in r else None, _shape(r["values"]) if "keys" in r else None,
               states, others, r["dtype"])
        groups[key] = groups.get(key, 0) + 1
    parts = []
    for (kind, keys, values, states, others, dtype), n in groups.items():
        held = []
        if keys is not None:
            held.append(f"keys and values {keys} each" if keys == values else f"keys {keys}, values {values}")
        if states is not None:
            held.append(f"{states} (fixed size)")
        if others is not None:
            held.append(others)
        parts.append(f"{n} layer{'s' if n != 1 else ''} of {kind}, {' and '.join(held)}, {dtype}")
    text = f"{fmt_bytes(g.kv_cache_bytes)} at {g.cache_len:,} tokens: " + "; ".join(parts)
    if not g.states_only:
        text += " (keys and values: batch x KV heads x tokens x head dim)"
    heads = {r["keys"][1] for r in g.layers if len(r.get("keys", ())) == 4}
    if g.query_heads and heads and max(heads) < g.query_heads:
        kv = "/".join(map(str, sorted(heads)))
        text += f"; {kv} KV heads for {g.query_heads} query heads (grouped-query attention)"
    return text


def generation_rows(report: ReportData) -> list[tuple[str, str]]:
    """The rows a generation adds to the summary (none for other estimates)."""
    g = report.generation
    if g is None:
        return []
    how = ("DynamicCache: each layer's keys and values grown by torch.cat at every token" if g.cache == "dynamic"
           else f"StaticCache: each layer's keys and values allocated for {g.cache_len:,} tokens at the prefill")
    if g.states_only:
        how = f"{g.cache_class}: each layer's recurrent states, a fixed size, updated at every token"
    elif g.cache == "none":
        how = NO_CACHE + " (--set use_cache=true: generate() keeps a cache)"
    elif g.state_layers:
        how += "; the linear-attention layers' recurrent states a fixed size, updated at every token"
    rows = [("Generation", f"prompt {g.prompt_len:,} tokens + {g.new_tokens:,} new, batch {g.batch}, greedy "
                           f"(transformers generate()); {how}"),
            ("KV cache", cache_words(report))]
    for name in (n for n in ("prefill", "decode") if n in g.stages):  # (one new token: the prefill alone)
        s = g.stages[name]
        quant = f" with {report.quantize} weights" if report.quantize else ""
        what = (f"{s.tokens:,} tokens in, no cache" if g.cache == "none"
                else f"{s.tokens:,} tokens in, {s.cached:,} cached after" if name == "prefill"
                else f"1 token in, {s.cached - 1:,} cached before and {s.cached:,} after")
        if g.cache != "none":
            what += f"; KV cache {fmt_bytes(s.kv_cache)} then"
        rows.append((f"Memory: peak during the {STAGE_WORDS[name]}",
                     f"{fmt_bytes(stage_peak(report, s))}{quant}, in the {place(report, s.peak_at)} ({what})"))
    if "decode" not in g.stages:
        pre = g.stages["prefill"].time_s
        rows.append(("FLOPs: prefill", f"{fmt_flops(g.stages['prefill'].flops)} (one new token: generate() runs the "
                                       f"prefill alone, no decode step)"))
        if pre is not None and report.gpu is not None:
            rows.append((f"Time on {report.gpu.name}", f"prefill {pre * 1e3:.1f} ms"))
        return rows
    rows.append(("FLOPs: prefill / one decode step", f"{fmt_flops(g.stages['prefill'].flops)} / "
                                                    f"{fmt_flops(g.stages['decode'].flops)}"))
    pre, dec = g.stages["prefill"].time_s, g.stages["decode"].time_s
    if pre is not None and dec is not None and report.gpu is not None:
        rows.append((f"Time on {report.gpu.name}", f"prefill {pre * 1e3:.1f} ms, last decode step {dec * 1e3:.2f} ms "
                                                   f"({g.tokens_per_s:,.0f} tokens/s for the batch); at most "
                                                   f"{(pre + g.new_tokens * dec):.2f} s for the whole generation "
                                                   f"(every decode step as long as the last)"))
    return rows
