"""The models of the CUDA reference data (``tests/data/cuda_reference``), built here exactly as
its recorder built them (``record/cuda_trace.py: cases()`` of the reference set, H100, torch 2.11).

Each builder returns ``(model, inputs, loss_fn or None)`` on the CPU, seeded.  torchvision has
no CPU build that runs beside the project's torch 2.13, so ResNet-50 and MobileNetV3-small are
faithful copies of torchvision 0.26's ``models/resnet.py`` and ``models/mobilenetv3.py`` (same
module tree, same in-place activations; BSD-3-Clause, (c) Soumith Chintala 2016, torchvision
authors): the tests check their parameter counts against the reference files.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data", "cuda_reference")

Case = tuple[nn.Module, Any, Callable | None]


def ce_loss(out: Any) -> torch.Tensor:
    """The recorder's loss for non-HF models: cross-entropy of the float32 logits against class 0."""
    logits = out.logits if hasattr(out, "logits") else out
    logits = logits.float().reshape(-1, logits.shape[-1])
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))


def _ids(vocab: int, b: int, s: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, s), generator=g)


def _hf(cfg_cls: str, model_cls: str, vocab: int, b: int, s: int, **cfg) -> Callable[[], Case]:
    def build() -> Case:
        import transformers as T

        torch.manual_seed(0)
        with torch.device("meta"):
            model = getattr(T, model_cls)(getattr(T, cfg_cls)(**cfg))
        ids = _ids(vocab, b, s)
        return model, {"input_ids": ids, "labels": ids.clone()}, None
    return build


# -- torchvision copies ----------------------------------------------------------------------


def _conv_norm_act(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1, dilation: int = 1,
                   norm: Callable[..., nn.Module] | None = nn.BatchNorm2d,
                   act: Callable[..., nn.Module] | None = nn.ReLU) -> nn.Sequential:
    """torchvision.ops.misc.Conv2dNormActivation: conv (no bias under a norm), norm, in-place activation."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2 * dilation, dilation=dilation,
                                         groups=groups, bias=norm is None)]
    if norm is not None:
        layers.append(norm(cout))
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        # statement by statement as torchvision writes it: Python frees each intermediate when its
        # variable is rebound, so the order of the statements is the order of the frees
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)

        out = self.conv3(out)
        out = self.bn3(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)

        return out


class ResNet(nn.Module):
    """torchvision.models.resnet.ResNet(block, layers) (weights=None)."""

    def __init__(self, block: type, layers: list[int], num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block: type, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        width = planes * block.expansion
        if stride != 1 or self.inplanes != width:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, width, 1, stride, bias=False), nn.BatchNorm2d(width))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = width
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)

        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)

        return x


class ResNet50(ResNet):
    """torchvision.models.resnet50(weights=None)."""

    def __init__(self, num_classes: int = 1000):
        super().__init__(Bottleneck, [3, 4, 6, 3], num_classes)


def _divisible(v: float, divisor: int = 8) -> int:
    """torchvision.models._utils._make_divisible."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def _scale(self, input):
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        return self.scale_activation(scale)

    def forward(self, input):
        scale = self._scale(input)
        return scale * input


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, use_se: bool, hs: bool, stride: int,
                 norm: Callable[..., nn.Module]):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        act = nn.Hardswish if hs else nn.ReLU
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(_conv_norm_act(cin, expanded, 1, norm=norm, act=act))
        layers.append(_conv_norm_act(expanded, expanded, kernel, stride, groups=expanded, norm=norm, act=act))
        if use_se:
            layers.append(SqueezeExcitation(expanded, _divisible(expanded // 4)))
        layers.append(_conv_norm_act(expanded, cout, 1, norm=norm, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, input):
        result = self.block(input)
        if self.use_res_connect:
            result += input
        return result


class MobileNetV3Small(nn.Module):
    """torchvision.models.mobilenet_v3_small(weights=None)."""

    SETTING = [(16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2), (24, 3, 88, 24, False, False, 1),
               (24, 5, 96, 40, True, True, 2), (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
               (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1), (48, 5, 288, 96, True, True, 2),
               (96, 5, 576, 96, True, True, 1), (96, 5, 576, 96, True, True, 1)]

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        norm = partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)
        layers: list[nn.Module] = [_conv_norm_act(3, 16, 3, 2, norm=norm, act=nn.Hardswish)]
        layers += [InvertedResidual(*cfg, norm=norm) for cfg in self.SETTING]
        layers.append(_conv_norm_act(96, 576, 1, norm=norm, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(inplace=True),
                                        nn.Dropout(p=0.2, inplace=True), nn.Linear(1024, num_classes))

    def forward(self, x):
        x = self.features(x)

        x = self.avgpool(x)
        x = torch.flatten(x, 1)

        x = self.classifier(x)

        return x


def _vision(cls: type, b: int, res: int = 224) -> Callable[[], Case]:
    def build() -> Case:
        torch.manual_seed(0)
        with torch.device("meta"):
            model = cls()
        g = torch.Generator().manual_seed(0)
        return model, (torch.randn(b, 3, res, res, generator=g),), ce_loss
    return build


# -- the project's examples and the LSTM ------------------------------------------------------


def _example(module: str) -> Callable[[], Case]:
    def build() -> Case:
        if ROOT not in sys.path:
            sys.path.insert(0, ROOT)
        import importlib

        model, inputs = importlib.import_module(f"examples.{module}").build()  # meta model and inputs
        # as the recorder did: materialised with to_empty, which unties tied weights (the examples'
        # GPT then has 21,130,240 parameters, the reference's count, not 16,935,936)
        model = model.to_empty(device="cpu")
        args = tuple(torch.zeros(a.shape, dtype=a.dtype) for a in inputs)
        return model, args, None
    return build


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8000, 256)
        self.rnn = nn.LSTM(256, 512, num_layers=2, batch_first=True)
        self.head = nn.Linear(512, 8000)

    def forward(self, x):
        return self.head(self.rnn(self.emb(x))[0])


def _lstm() -> Case:
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LSTMNet()
    return model, (_ids(8000, 16, 128),), ce_loss


_LLAMA = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
              num_key_value_heads=4, vocab_size=32000, use_cache=False)

CASES: dict[str, Callable[[], Case]] = {
    "gpt2_124m": _hf("GPT2Config", "GPT2LMHeadModel", 50257, 8, 1024, use_cache=False),
    "llama_small": _hf("LlamaConfig", "LlamaForCausalLM", 32000, 4, 1024, **_LLAMA),
    "bert_small": _hf("BertConfig", "BertForMaskedLM", 30522, 8, 512, hidden_size=512, num_hidden_layers=4,
                      num_attention_heads=8, intermediate_size=2048),
    "t5_small": _hf("T5Config", "T5ForConditionalGeneration", 32128, 8, 512, d_model=512, d_ff=2048, num_layers=6,
                    num_heads=8, use_cache=False, decoder_start_token_id=0),
    "resnet50_b64": _vision(ResNet50, 64),
    "mobilenet_v3_small_b64": _vision(MobileNetV3Small, 64),
    "lstm_2x512": _lstm,
    "mixtral_small": _hf("MixtralConfig", "MixtralForCausalLM", 32000, 4, 1024, hidden_size=512,
                         intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         num_local_experts=4, num_experts_per_tok=2, vocab_size=32000, use_cache=False),
    "llama_small_s4096": _hf("LlamaConfig", "LlamaForCausalLM", 32000, 1, 4096,
                             **{**_LLAMA, "max_position_embeddings": 4096}),
    "gpt2_124m_b2": _hf("GPT2Config", "GPT2LMHeadModel", 50257, 2, 1024, use_cache=False),
    "gpt2_124m_b16_s512": _hf("GPT2Config", "GPT2LMHeadModel", 50257, 16, 512, use_cache=False),
    "llama_small_b1": _hf("LlamaConfig", "LlamaForCausalLM", 32000, 1, 1024, **_LLAMA),
    "resnet50_b16": _vision(ResNet50, 16),
    "resnet50_b256": _vision(ResNet50, 256),
    "example_gpt": _example("gpt"),
    "example_vgg": _example("vgg"),
}
