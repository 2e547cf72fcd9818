"""Models and training loops of the second H100 recording (``tests/data/h100_loops``), built here exactly as
its recorder (``benchmarks/record_h100.py``) built them, so CPU tests estimate the same steps.

The reference set (``tests/cuda_cases.py``) holds one loop (``out = model(...)`` kept through backward) and
no compiled or float8 step; these cases are the loops and models it lacks: the output released once the
loss is computed, a module that returns only the loss, gradient accumulation, selective checkpointing,
models of other shapes (GPT-2 medium, a Qwen2-0.5B-shaped model, BERT-base, a two-convolution CNN, an
embedding + LSTM, ResNet-18, MobileNetV3-Large, ConvNeXt-Tiny).

Each builder takes the device to build on (``"meta"`` for the estimator, ``"cpu"`` for the recorder, which
moves the model to the GPU) and returns ``(model, inputs, loss_fn or None)``; ``inputs`` is a dict for
Hugging Face models (labels included) and a tuple otherwise.  ResNet-18 and MobileNetV3-Large are copies of
torchvision 0.26's models (BSD-3-Clause, (c) Soumith Chintala 2016, torchvision authors), as in
``cuda_cases``: torchvision does not run beside the project's CPU torch.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from cuda_cases import InvertedResidual, ResNet, _conv_norm_act, _ids, ce_loss

Case = tuple[nn.Module, Any, Callable | None]


class LossOnly(nn.Module):
    """A module that wraps a Hugging Face model and returns only ``.loss`` (the wrapper of issue 20)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, **batch):
        return self.inner(**batch).loss


def _transformers():
    """transformers, importable also beside PyPI's torchvision and the CPU torch (the test extras)."""
    from estimator.compat import import_torchvision

    import_torchvision()
    import transformers

    return transformers


def _hf(model_cls: str, cfg_cls: str, vocab: int, b: int, s: int, wrap: bool = False, **cfg) -> Callable[..., Case]:
    def build(device: str = "meta") -> Case:
        T = _transformers()

        torch.manual_seed(0)
        with torch.device(device):
            model = getattr(T, model_cls)(getattr(T, cfg_cls)(**cfg))
        ids = _ids(vocab, b, s)
        return (LossOnly(model) if wrap else model), {"input_ids": ids, "labels": ids.clone()}, None
    return build


def _hf_image(model_cls: str, cfg_cls: str, b: int, res: int = 224, **cfg) -> Callable[..., Case]:
    def build(device: str = "meta") -> Case:
        T = _transformers()

        torch.manual_seed(0)
        with torch.device(device):
            model = getattr(T, model_cls)(getattr(T, cfg_cls)(**cfg))
        g = torch.Generator().manual_seed(0)
        pixels = torch.randn(b, 3, res, res, generator=g)
        return model, {"pixel_values": pixels, "labels": torch.zeros(b, dtype=torch.long)}, None
    return build


class SmallCNN(nn.Module):
    """Two 3x3 convolutions with batch norm on 32x32 images (issue 20's small CNN)."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class EmbeddingLSTM(nn.Module):
    """An embedding and a 2-layer LSTM language model (issue 20's recurrent model)."""

    def __init__(self, vocab: int = 10000, emb: int = 256, hidden: int = 256):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = nn.LSTM(emb, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.head(self.rnn(self.emb(x))[0])


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        # statement by statement as torchvision writes it (the order of the frees)
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)

        return out


class ResNet18(ResNet):
    """torchvision.models.resnet18(weights=None)."""

    def __init__(self, num_classes: int = 1000):
        super().__init__(BasicBlock, [2, 2, 2, 2], num_classes)


class MobileNetV3Large(nn.Module):
    """torchvision.models.mobilenet_v3_large(weights=None): (cin, kernel, expanded, cout, SE, hard-swish, stride)."""

    SETTING = [(16, 3, 16, 16, False, False, 1), (16, 3, 64, 24, False, False, 2), (24, 3, 72, 24, False, False, 1),
               (24, 5, 72, 40, True, False, 2), (40, 5, 120, 40, True, False, 1), (40, 5, 120, 40, True, False, 1),
               (40, 3, 240, 80, False, True, 2), (80, 3, 200, 80, False, True, 1), (80, 3, 184, 80, False, True, 1),
               (80, 3, 184, 80, False, True, 1), (80, 3, 480, 112, True, True, 1), (112, 3, 672, 112, True, True, 1),
               (112, 5, 672, 160, True, True, 2), (160, 5, 960, 160, True, True, 1), (160, 5, 960, 160, True, True, 1)]

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        norm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
        layers: list[nn.Module] = [_conv_norm_act(3, 16, 3, 2, norm=norm, act=nn.Hardswish)]
        layers += [InvertedResidual(*cfg, norm=norm) for cfg in self.SETTING]
        layers.append(_conv_norm_act(160, 960, 1, norm=norm, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(inplace=True),
                                        nn.Dropout(p=0.2, inplace=True), nn.Linear(1280, num_classes))

    def forward(self, x):
        x = self.features(x)

        x = self.avgpool(x)
        x = torch.flatten(x, 1)

        x = self.classifier(x)

        return x


def _module(cls: type, *shape: int, ids: int | None = None) -> Callable[..., Case]:
    def build(device: str = "meta") -> Case:
        torch.manual_seed(0)
        with torch.device(device):
            model = cls()
        if ids is not None:
            return model, (_ids(ids, *shape),), ce_loss
        g = torch.Generator().manual_seed(0)
        return model, (torch.randn(*shape, generator=g),), ce_loss
    return build


def torchtitan_op_context_fn():
    """torchtitan's per-op selective-checkpoint policy (``_get_custom_policy``), written out here as the
    reference of tests/test_loops.py and benchmarks/record_h100.py: save the attention kernels',
    reduce-scatters' and ``max``'s outputs and every other ``mm``'s, counting forward and recomputation apart."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_cudnn_attention.default,
            aten.max.default, torch.ops._c10d_functional.reduce_scatter_tensor.default}
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == aten.mm.default:
            meta[key] += 1
        keep = func in save and not (func == aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


GPT2 = dict(use_cache=False)
GPT2_MEDIUM = dict(n_embd=1024, n_layer=24, n_head=16, use_cache=False)
QWEN2_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6,
                 max_position_embeddings=32768, use_cache=False)
BERT_BASE: dict = {}
LLAMA_SMALL = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                   num_key_value_heads=4, vocab_size=32000, use_cache=False)
# Llama 3 8B's widths (hidden 4,096, MLP 14,336, 32 heads, 8 KV heads, 128,256-word vocabulary) with 4 of
# its 32 layers: GEMMs of the size float8 is for, on one GPU
LLAMA3_8B_L4 = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192,
                    use_cache=False)


def gpt2(b: int, s: int = 1024, wrap: bool = False) -> Callable[..., Case]:
    return _hf("GPT2LMHeadModel", "GPT2Config", 50257, b, s, wrap=wrap, **GPT2)


def bert_base(b: int, s: int = 512, wrap: bool = False) -> Callable[..., Case]:
    return _hf("BertForMaskedLM", "BertConfig", 30522, b, s, wrap=wrap, **BERT_BASE)


def llama_small(b: int, s: int = 1024, wrap: bool = False) -> Callable[..., Case]:
    return _hf("LlamaForCausalLM", "LlamaConfig", 32000, b, s, wrap=wrap, **LLAMA_SMALL)


MODELS: dict[str, Callable[..., Case]] = {
    "gpt2_124m": gpt2(8),
    "gpt2_124m_wrapped": gpt2(8, wrap=True),
    "gpt2_124m_b4": gpt2(4),
    "gpt2_medium_b4": _hf("GPT2LMHeadModel", "GPT2Config", 50257, 4, 1024, **GPT2_MEDIUM),
    "qwen2_05b_b4": _hf("Qwen2ForCausalLM", "Qwen2Config", 151936, 4, 1024, **QWEN2_05B),
    "bert_base_b16": bert_base(16),
    "llama_small": llama_small(4),
    "llama3_8b_l4": _hf("LlamaForCausalLM", "LlamaConfig", 128256, 1, 8192, **LLAMA3_8B_L4),
    "small_cnn_b64": _module(SmallCNN, 64, 3, 32, 32),
    "lstm_emb_b32": _module(EmbeddingLSTM, 32, 64, ids=10000),
    "resnet18_b32": _module(ResNet18, 32, 3, 224, 224),
    "mobilenet_v3_large_b64": _module(MobileNetV3Large, 64, 3, 224, 224),
    "convnext_tiny_b32": _hf_image("ConvNextForImageClassification", "ConvNextConfig", 32, num_labels=1000),
}

# name -> (model builder for a batch size, the sequence or image size), for the largest-batch searches
SEARCHES: dict[str, Callable[[int], Callable[..., Case]]] = {
    "gpt2_124m_wrapped": lambda b: gpt2(b, wrap=True),
    "bert_base_wrapped": lambda b: bert_base(b, wrap=True),
    "llama_small": lambda b: llama_small(b),
}


def recorded(folder: str, name: str) -> list[dict]:
    """The records of one JSON-lines file of a recording (``tests/data/h100_loops``, ``tests/data/h200``)."""
    import json
    import os

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", folder, name)) as f:
        return [json.loads(line) for line in f]
