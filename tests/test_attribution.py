"""Per-module attribution, forward and backward, against a real CPU step (tests/moduletruth.py).

Each backward op belongs to the module whose forward created the autograd node that runs it
(a convolution's backward to the Conv2d, not to the BatchNorm after it; the last Linear's
backward to the Linear, not to an external loss).  For every model: the matmul-class FLOPs of
every module, forward and backward, equal the real step's exactly, and so do the counts of the
heavy ops (every ``*_backward`` kernel, mm/bmm/addmm, convolution, attention) each module runs.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import moduletruth
import zoo
from conftest import build_case
from estimator import estimate

logging.getLogger("estimator").setLevel(logging.ERROR)


# -- models this file adds: a ResNet, a ViT and a Hugging Face LM, each with an external loss --------


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = 4 * width
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    """torchvision's ResNet layout, shrunk: stem, two stages of bottlenecks, pooling, fc."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(2)
        self.layer1 = nn.Sequential(Bottleneck(8, 4), Bottleneck(16, 4))
        self.layer2 = nn.Sequential(Bottleneck(16, 8, stride=2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(self.layer2(self.layer1(x))), 1))


def class_zero_loss(logits):
    """Cross-entropy against labels made inside the loss (as estimator.specs does for image models):
    the label tensor's creation makes no autograd node."""
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long))


def resnet(device: str = "cpu"):
    torch.manual_seed(0)
    return ResNet(), torch.randn(2, 3, 16, 16), class_zero_loss


class ViT(nn.Module):
    """Patch embedding (a strided conv), class token, pre-norm nn.TransformerEncoderLayer blocks."""

    def __init__(self, dim: int = 32, depth: int = 2, classes: int = 10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, 17, dim))
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.0, batch_first=True,
                                                               norm_first=True) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def vit(device: str = "cpu"):
    torch.manual_seed(0)
    return ViT(), torch.randn(2, 3, 16, 16), class_zero_loss


def hf_llama_external_loss(device: str = "cpu"):
    """A causal LM without labels: the loss is computed outside the model from the logits."""
    model, inputs, _ = zoo.hf_llama_sdpa(device)
    ids = inputs.pop("labels")
    return model, inputs, lambda out: F.cross_entropy(out.logits.flatten(0, 1), ids.flatten())


EXTRA = {"resnet": resnet, "vit": vit, "hf_llama_external_loss": hf_llama_external_loss}
# zoo variants whose modules are those of another case (a dtype, a memory format, an attention kernel, a
# padding mask, a second RNN direction, a real-tensor fallback) are left out to keep the suite fast
SAME_MODULES = {"gpt_bf16", "vgg_channels_last", "hf_bert_unpadded", "hf_llama_eager", "lstm_bidir", "branchy"}
CASES = list(EXTRA) + [name for name in zoo.ZOO if name not in SAME_MODULES]


def _build(name: str):
    if name in EXTRA:
        if name.startswith("hf_"):
            pytest.importorskip("transformers")
        return EXTRA[name]()
    return build_case(name)


HEAVY = ("mm", "bmm", "addmm", "baddbmm", "convolution", "_grouped_mm")


def _heavy(op: str) -> bool:
    return op.endswith("_backward") or op.endswith("_backward_data") or op in HEAVY or "attention" in op


def _estimated(report) -> dict:
    """Per module, from the estimate: matmul-class FLOPs and heavy-op counts, forward and backward."""
    t = report.tally
    ops = {"forward": {}, "backward": {}}
    for node in report.capture.nodes:
        phase = {"loss": "forward"}.get(node.meta["phase"], node.meta["phase"])
        name = node.target._overloadpacket.__name__
        if phase in ops and _heavy(name):
            ops[phase].setdefault(node.meta["module"], Counter())[name] += 1
    return {
        "forward": {p: m.matmul_forward for p, m in t.modules.items() if m.matmul_forward},
        "backward": {p: m.matmul_backward for p, m in t.modules.items() if m.matmul_backward},
        "forward_ops": ops["forward"],
        "backward_ops": ops["backward"],
    }


def _heavy_ops(per_module: dict) -> dict:
    out = {}
    for module, counts in per_module.items():
        heavy = Counter({op: n for op, n in counts.items() if _heavy(op)})
        if heavy:
            out[module] = heavy
    return out


@pytest.mark.parametrize("name", CASES)
def test_per_module_forward_and_backward_match_a_real_step(name):
    model, inputs, loss_fn = _build(name)
    truth = moduletruth.measure_modules(model, inputs, loss_fn)
    assert truth["uncredited"] == []
    est = _estimated(estimate(model, inputs, loss_fn=loss_fn, device="cpu", optimizer="none"))
    assert est["forward"] == truth["forward"]
    assert est["backward"] == truth["backward"]
    assert est["forward_ops"] == _heavy_ops(truth["forward_ops"])
    assert est["backward_ops"] == _heavy_ops(truth["backward_ops"])


def test_the_ground_truth_credits_conv_and_head_backward_to_their_own_modules():
    """The cases the issue reported: each Conv2d has its convolution backward, BatchNorm none, and
    the last Linear before an external loss its own backward, not ``(loss)``'s."""
    model, inputs, loss_fn = resnet()
    truth = moduletruth.measure_modules(model, inputs, loss_fn)
    convs = [p for p, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    norms = [p for p, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(truth["backward_ops"][p]["convolution_backward"] == 1 for p in convs)
    assert all("convolution_backward" not in truth["backward_ops"][p] for p in norms)
    assert truth["backward"]["fc"] > 0 and "(loss)" not in truth["backward"]
