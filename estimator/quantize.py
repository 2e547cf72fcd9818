"""Weight-only quantization for inference and generation, as bitsandbytes lays the weights out when
transformers / accelerate load a model with ``load_in_8bit`` / ``load_in_4bit`` (BitsAndBytesConfig
defaults):

* int8, LLM.int8() (``bnb.nn.Linear8bitLt``, ``Int8Params``): the weight as int8 ``CB`` (out x in,
  1 byte each) plus ``SCB``, one float32 absmax scale per output row (row-wise quantization:
  Dettmers et al. 2022, "LLM.int8()", section 3; bitsandbytes ``int8_vectorwise_quant``).
* int4, NF4 / FP4 (``bnb.nn.Linear4bit``, ``Params4bit``, ``quantize_4bit``): two 4-bit values
  per byte (ceil(out x in / 2) bytes) plus one float32 absmax per block of 64 weights
  (``blocksize=64``; ``bnb_4bit_use_double_quant=False``, transformers' default).  The matmul
  dequantizes one layer's weight at a time to the compute dtype (16-bit), a temporary of
  out x in x 2 bytes.

Only the weights of ``nn.Linear`` (and transformers' ``Conv1D``) layers are quantized, as
``replace_with_bnb_linear`` does; biases, embeddings, norms, and what transformers'
``get_keys_to_not_convert`` keeps in full precision (the output head ``lm_head``, the module
holding the last parameter, tied weights) stay as they are.

The what-ifs (:func:`quantized_what_ifs`) are shown beside every inference estimate;
``estimate(quantize="int4")`` (``--quantize int4``) sizes the estimate itself with them
(:func:`quantized_peak`): its headline answers with the quantized weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QUANT_SCHEMES = {
    "int8": dict(layout="bitsandbytes LLM.int8: int8 weights + one float32 scale per output row",
                 bits=8, group=None),
    "int4": dict(layout="bitsandbytes NF4/FP4: 4-bit weights, two per byte + one float32 absmax per 64 weights",
                 bits=4, group=64),
}
# the schemes an inference or generation estimate is traced over (estimator.qlora's Linear4bit, see
# estimator.lora.finetuned); int8 is a what-if on the unquantized trace
TRACED_4BIT = ("int4", "int4-dq")
INT4_COMPUTE_BYTES = 2  # the 16-bit compute dtype one dequantized layer takes during its matmul


@dataclass
class QuantizedWhatIf:
    """Inference with the weights of the ``nn.Linear`` layers quantized (weight-only), see QUANT_SCHEMES."""

    scheme: str
    layout: str
    layers: int  # Linear layers quantized
    params: int  # their weights' elements
    weights_before: int  # bytes of those weights as traced
    weights_after: int  # bytes quantized (values + scales)
    parameters: int  # all parameter bytes after quantization
    peak: int  # the inference peak with the quantized weights

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def check_scheme(scheme: str | None, mode: str, lora: bool = False) -> None:
    """``quantize=`` names a scheme for inference or generation, or a 4-bit base for QLoRA (training with
    ``lora``: ``int4`` or ``int4-dq``, double quantization; :mod:`estimator.qlora`), or a one-line error."""
    from .errors import UserError

    if scheme is None:
        return
    if mode == "train":
        if scheme not in ("int4", "int4-dq"):
            raise UserError(f"training over quantized weights is QLoRA's 4-bit base: --quantize int4 or int4-dq "
                            f"(double quantization) with --lora, not {scheme!r}")
        if not lora:
            raise UserError(f"--quantize {scheme} freezes the model's Linear layers in 4 bits: add --lora (QLoRA: "
                            f"adapters trained over them), or size serving with estimate --mode inference or "
                            f"generate")
        return
    if scheme not in QUANT_SCHEMES and scheme != "int4-dq":
        raise UserError(f"quantize must be one of {', '.join(QUANT_SCHEMES)} or int4-dq, not {scheme!r}")


def _quantizable(cap: Any) -> list[tuple[str, int, int, int]]:
    """(module path, output features, input features, bytes per weight) of every layer the what-if quantizes:
    ``nn.Linear`` and its subclasses and transformers' ``Conv1D`` (GPT-2; weight stored in x out), as transformers'
    ``replace_with_bnb_linear`` picks them, less what ``get_keys_to_not_convert`` keeps: the output
    head (``lm_head``), the module holding the last parameter, and tied weights (owned by another module)."""
    last_owner = cap.param_owner[next(reversed(cap.params))] if cap.params else None
    layers = []
    for path, kind in cap.module_types.items():
        if kind not in ("Linear", "Conv1D", *cap.linear_classes) or path == last_owner or path.rpartition(".")[2] == "lm_head":
            continue
        weight = cap.params.get(f"{path}.weight")
        if weight is None or weight.ndim != 2:  # tied: the weight is owned by another module
            continue
        rows, cols = tuple(reversed(weight.shape)) if kind == "Conv1D" else weight.shape
        layers.append((path, rows, cols, weight.element_size()))
    return layers


def _scheme_bytes(cap: Any, device: str, scheme: str) -> tuple[int, int, int, int, int]:
    """(layers, elements, exact bytes before, exact bytes after, bytes the peak moves by) of ``scheme`` on the
    traced weights.  The peak's move is the step's timeline simulated again with each quantized weight's storage
    at its quantized bytes and the 16-bit copies autocast caches of those weights gone (a quantized layer makes
    none: bitsandbytes casts its input), the peak wherever it then lands (BLOOM's int8 peak moves from the head
    to an MLP: -25 % when taken at the same moment), plus, for int4, one layer's weight dequantized to 16 bits
    (an upper bound: that temporary is counted at the peak)."""
    from .memory import round_cuda, simulate

    memo = cap.__dict__.setdefault("_quantized", {})  # (a report asks again for its headline and its table)
    if (device, scheme) in memo:
        return memo[device, scheme]
    rnd = round_cuda if device == "cuda" else (lambda n: n)
    spec = QUANT_SCHEMES[scheme]
    layers = _quantizable(cap)
    weight_sid = {str(n.target)[len("param_"):]: n.meta["storage"][0] for n in cap.records
                  if n.op == "placeholder" and str(n.target).startswith("param_") and n.meta.get("storage")}
    resize = {sid: 0 for sid in _autocast_copies(cap, {f"{path}.weight" for path, *_ in layers})}
    exact_before = exact_after = elements = largest = 0
    for path, rows, cols, size in layers:
        n = rows * cols
        elements += n
        if spec["bits"] == 8:
            tensors = [n, 4 * rows]  # int8 CB (out x in) + float32 SCB (out,)
        else:
            tensors = [-(-n // 2), 4 * -(-n // spec["group"])]  # packed 4-bit + float32 absmax per 64
            largest = max(largest, rnd(INT4_COMPUTE_BYTES * n))
        exact_before += n * size
        exact_after += sum(tensors)
        sid = weight_sid.get(f"{path}.weight")
        if sid is not None:  # (the statistics as the weight's storage grown: the allocator rounds them apart)
            resize[sid] = sum(rnd(t) for t in tensors) if device == "cuda" else sum(tensors)
    before = simulate(cap, device, allocator=False, need=False)
    after = simulate(cap, device, resize=resize, allocator=False, need=False)
    moved = max(before.peak, before.peak_first_step) - max(after.peak, after.peak_first_step)
    memo[device, scheme] = len(layers), elements, exact_before, exact_after, moved - largest
    return memo[device, scheme]


def _autocast_copies(cap: Any, weights: set[str]) -> set[int]:
    """Storages of the casts autocast makes of ``weights`` (parameter names): ``_to_copy`` ops whose input is the
    parameter itself, once each."""
    held = {id(n): str(n.target)[len("param_"):] for n in cap.records
            if n.op == "placeholder" and str(n.target).startswith("param_")}
    out: set[int] = set()
    for node in cap.nodes:
        if node.args and id(node.args[0]) in held and held[id(node.args[0])] in weights \
                and "_to_copy" in str(node.target) and node.meta.get("storage"):
            out.add(node.meta["storage"][0])
    return out


def quantized_peak(cap: Any, device: str, peak: int, scheme: str) -> int:
    """``peak`` (an inference or generation peak of ``cap``'s model) with the weights quantized by ``scheme``."""
    return peak - _scheme_bytes(cap, device, scheme)[4]


def quantized_what_ifs(cap: Any, tally: Any, device: str, peak: int) -> list[QuantizedWhatIf]:
    """int8 and int4 weight-only what-ifs of an inference estimate (layouts: QUANT_SCHEMES).

    ``parameters``: the parameter bytes with those weights quantized (exact bytes); ``peak``: the
    inference peak moved by :func:`_scheme_bytes` (the timeline replayed with the quantized storages, each
    rounded as the target's allocator does, the peak wherever it lands), plus, for int4, one layer's weight
    dequantized to 16 bits (an upper bound: that temporary is counted at the peak)."""
    out = []
    for scheme, spec in QUANT_SCHEMES.items():
        layers, elements, before, after, moved = _scheme_bytes(cap, device, scheme)
        if not layers:
            return []
        out.append(QuantizedWhatIf(scheme=scheme, layout=spec["layout"], layers=layers, params=elements,
                                   weights_before=before, weights_after=after,
                                   parameters=tally.parameters_bytes - (before - after), peak=peak - moved))
    return out
