"""Small models for the accuracy tests: each builder returns ``(model, inputs, loss_fn or None)``.

Every builder is seeded and takes a few ms on CPU.  Builders accept ``device``
("cpu" or "meta") where the meta-device test uses them: the model and its
inputs are then built under ``torch.device("meta")`` with the same shapes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

Case = tuple[nn.Module, Any, Callable | None]


# ---------------------------------------------------------------------------
# the shipped examples (examples/*.py), shrunk
# ---------------------------------------------------------------------------

from examples.cruncher import Cruncher  # noqa: E402
from examples.gpt import GPT, Block, GPTConfig  # noqa: E402,F401  (Block: the checkpoint what-if test)
from examples.mlp import MLP  # noqa: E402
from examples.vgg import VGG  # noqa: E402


def cruncher(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return Cruncher(dim=32, num_layers=4), torch.randn(16, 32), None  # default loss: output.mean()


def mlp(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return MLP(in_features=48, hidden=64, depth=3, classes=10), \
            (torch.randn(8, 3, 4, 4), torch.randint(0, 10, (8,))), None


def vgg(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return VGG(config=(8, 8, "M", 16, 16, "M"), classes=10), \
            (torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))), None


def gpt(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        idx = torch.randint(0, 96, (2, 16))
        model = GPT(GPTConfig(vocab_size=96, block_size=32, n_layer=2, n_head=4, n_embd=32))
        return model, (idx, torch.randint(0, 96, (2, 16))), None


# ---------------------------------------------------------------------------
# HF transformers (shrunk configs, random weights, no download)
# ---------------------------------------------------------------------------


def _hf(model_type: str, auto: str, attn: str | None = None, device: str = "cpu", **cfg_kwargs):
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type, **cfg_kwargs)
    if attn is not None:
        cfg._attn_implementation = attn
    torch.manual_seed(0)
    kwargs = {"attn_implementation": attn} if attn is not None else {}
    with torch.device(device):
        return getattr(transformers, auto).from_config(cfg, **kwargs)


def _on(device: str, inputs: dict) -> dict:
    """The inputs (built on CPU from a seeded generator) moved to ``device``."""
    return {k: v.to(device) for k, v in inputs.items()}


def gpt_bf16(device: str = "cpu") -> Case:
    """The GPT above in bfloat16 (CPU SDPA, layer norm and cross-entropy in bf16)."""
    model, inputs, loss_fn = gpt(device)
    return model.to(torch.bfloat16), inputs, loss_fn


def vgg_channels_last(device: str = "cpu") -> Case:
    model, (x, target), loss_fn = vgg(device)
    return model.to(memory_format=torch.channels_last), (x.contiguous(memory_format=torch.channels_last), target), loss_fn


def hf_gpt2(device: str = "cpu") -> Case:
    model = _hf("gpt2", "AutoModelForCausalLM", device=device, n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return model, _on(device, {"input_ids": ids, "labels": ids.clone()}), None


def _bert(padded: bool, device: str) -> Case:
    model = _hf("bert", "AutoModelForMaskedLM", device=device, vocab_size=128, hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (2, 16), generator=g)
    labels = torch.where(torch.rand(2, 16, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 12:] = 0  # the second sequence is 12 tokens long
    return model, _on(device, {"input_ids": ids, "attention_mask": mask, "labels": labels}), None


def hf_bert(device: str = "cpu") -> Case:
    """BERT MLM, a padded batch: HF builds the SDPA mask in both the real and the fake step."""
    return _bert(True, device)


def hf_bert_unpadded(device: str = "cpu") -> Case:
    """BERT MLM with an all-ones attention_mask: on real tensors HF drops the mask
    (``padding_mask.all()`` in transformers.masking_utils), on fake tensors it cannot read
    the values and keeps it, so SDPA saves a (B, 1, S, S) mask per layer in the fake step only."""
    return _bert(False, device)


def _llama(attn: str, device: str) -> Case:
    model = _hf("llama", "AutoModelForCausalLM", attn, device, vocab_size=128, hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return model, _on(device, {"input_ids": ids, "labels": ids.clone()}), None


def tiny_llama(vocab: int = 512, layers: int = 2, seq: int = 32, batch: int = 2) -> tuple[nn.Module, dict]:
    """A Hugging Face Llama 64 wide (4 heads, 2 key/value heads), MLP 128, ``layers`` layers, SDPA attention, no
    KV cache, random weights (seed 0); ``batch x seq`` token ids (seed 1), the labels too."""
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "labels": ids.clone()}


def hf_llama_sdpa(device: str = "cpu") -> Case:
    return _llama("sdpa", device)


def hf_llama_eager(device: str = "cpu") -> Case:
    return _llama("eager", device)


def hf_t5(device: str = "cpu") -> Case:
    model = _hf("t5", "AutoModelForSeq2SeqLM", device=device, vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                num_decoder_layers=2, num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    g = torch.Generator().manual_seed(1)
    return model, _on(device, {"input_ids": torch.randint(1, 128, (2, 12), generator=g),
                               "labels": torch.randint(1, 128, (2, 8), generator=g)}), None


# ---------------------------------------------------------------------------
# other architectures and features
# ---------------------------------------------------------------------------


class LSTMModel(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 16, hidden: int = 24, classes: int = 5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, ids, target):
        out, _ = self.rnn(self.emb(ids))
        return F.cross_entropy(self.head(out[:, -1]), target)


def lstm(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return LSTMModel(), (torch.randint(0, 64, (4, 10)), torch.randint(0, 5, (4,))), None


class GRUModel(nn.Module):
    def __init__(self, d: int = 12, hidden: int = 20):
        super().__init__()
        self.rnn = nn.GRU(d, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        out, h = self.rnn(x)
        return self.head(out).squeeze(-1)  # (B, T): default loss


def gru(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return GRUModel(), torch.randn(3, 7, 12), None


class MobileBlock(nn.Module):
    """Depthwise (groups=C) 3x3 conv + BN + hardswish, pointwise 1x1 conv + BN, grouped conv."""

    def __init__(self, c: int = 16, out: int = 24):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.pw = nn.Conv2d(c, out, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.grouped = nn.Conv2d(out, out, 3, padding=1, groups=4)
        self.head = nn.Linear(out, 10)

    def forward(self, x):
        x = F.hardswish(self.stem(x))
        x = F.hardswish(self.bn1(self.dw(x)))
        x = self.bn2(self.pw(x))
        x = F.relu(self.grouped(x))
        return self.head(x.mean((2, 3)))


def mobilenet(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return MobileBlock(), torch.randn(2, 3, 16, 16), lambda out: out.logsumexp(-1).mean()


class Branchy(nn.Module):
    """Data-dependent Python control flow: cannot run on fake tensors."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 4)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:
            h = torch.tanh(self.b(h))
        else:
            h = torch.sigmoid(self.b(h)) * 2
        return self.c(h)


def branchy(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return Branchy(), torch.randn(8, 16), None


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool, d: int = 24):
        super().__init__()
        self.reentrant = reentrant
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                                     for _ in range(2)])
        self.out = nn.Linear(d, 1)

    def forward(self, x):
        x = self.inp(x)
        for blk in self.blocks:
            x = x + checkpoint(blk, x, use_reentrant=self.reentrant)
        return self.out(torch.tanh(x)).mean()  # scalar output


def checkpoint_reentrant(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return Checkpointed(True), torch.randn(6, 24), None


def checkpoint_nonreentrant(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return Checkpointed(False), torch.randn(6, 24), None


class DictInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.proj = nn.Linear(8, 6)

    def forward(self, *, image, mask):
        h = F.silu(self.conv(image)) * mask[:, None]  # mask (B, H, W)
        return {"logits": self.proj(h.flatten(2).transpose(1, 2)), "mask": mask}


def dict_inputs(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        image = torch.randn(2, 3, 8, 8)
        mask = (torch.rand(2, 8, 8) > 0.5).float()
        model = DictInputs()
    return model, {"image": image, "mask": mask}, None  # default loss: mean of "logits" ("mask" needs no grad)


class TiedEmbeddings(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids):
        return self.out(torch.relu(self.mix(self.emb(ids))))  # (B, T, vocab)


def tied(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (3, 9))
    targets = torch.randint(0, 50, (3, 9))  # real CPU tensor captured by loss_fn, even for a meta model
    with torch.device(device):
        model = TiedEmbeddings()
    return model, ids.to(device), lambda logits: F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(20, 32)
        self.first.requires_grad_(False)
        self.norm = nn.LayerNorm(32)
        self.second = nn.Linear(32, 32)
        self.third = nn.Linear(32, 3)

    def forward(self, x):
        return self.third(F.relu(self.second(self.norm(self.first(x)))))


def frozen(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return Frozen(), torch.randn(5, 20), None


class BiLSTM(nn.Module):
    """Bidirectional single-layer LSTM, time-major input (one mkldnn_rnn_layer per direction)."""

    def __init__(self, d: int = 10, hidden: int = 12):
        super().__init__()
        self.rnn = nn.LSTM(d, hidden, bidirectional=True)
        self.head = nn.Linear(2 * hidden, 3)

    def forward(self, x):
        out, (h, c) = self.rnn(x)
        return self.head(out).mean() + h.square().mean()


def lstm_bidir(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        x = torch.randn(6, 3, 10, requires_grad=True)  # (T, B, I); the input requires grad
        return BiLSTM(), x, None


class Convs(nn.Module):
    """Conv1d (dilated, strided), ConvTranspose2d (grouped), Conv3d: every conv flavour of convolution(_backward)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(4, 8, 3, dilation=2, stride=2)
        self.up = nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.c3 = nn.Conv3d(6, 4, (1, 3, 3), padding=(0, 1, 1), bias=False)

    def forward(self, x):
        h = F.relu(self.c1(x))  # (B, 8, L)
        h = h[..., None] * h[..., None, :]  # (B, 8, L, L)
        h = self.up(h)  # (B, 6, 2L, 2L)
        return self.c3(h[:, :, None]).mean((1, 2))  # (B, 2L, 2L)


def convs(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return Convs(), torch.randn(2, 4, 21), None


class AttnVariants(nn.Module):
    """SDPA with GQA, a float mask, cross attention of unequal lengths and dropout; einsum attention;
    batched matmul with broadcasting and baddbmm."""

    def __init__(self, d: int = 32, heads: int = 4, kv_heads: int = 2):
        super().__init__()
        self.h, self.kvh, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * kv_heads * self.hd)
        self.bias = nn.Parameter(torch.zeros(heads, 1, 1))
        self.o = nn.Linear(d, d)

    def forward(self, x, memory):
        B, T, D = x.shape
        S = memory.shape[1]
        q = self.q(x).view(B, T, self.h, self.hd).transpose(1, 2)  # (B, h, T, hd)
        k, v = self.kv(x).view(B, T, 2, self.kvh, self.hd).permute(2, 0, 3, 1, 4)  # (B, kvh, T, hd)
        mask = torch.randn(T, T).tril()  # a float additive mask
        y1 = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        km, vm = self.kv(memory).view(B, S, 2, self.kvh, self.hd).permute(2, 0, 3, 1, 4)
        km, vm = km.repeat_interleave(2, 1), vm.repeat_interleave(2, 1)
        y2 = F.scaled_dot_product_attention(q, km, vm, dropout_p=0.1)  # cross attention, T != S, dropout
        scores = torch.einsum("bhtd,bhsd->bhts", q, k.repeat_interleave(2, 1)) / self.hd ** 0.5
        y3 = torch.matmul(torch.softmax(scores + self.bias, -1), v.repeat_interleave(2, 1))  # 4-D matmul -> bmm
        y4 = torch.baddbmm(y3.flatten(0, 1), q.flatten(0, 1), torch.eye(self.hd).expand(B * self.h, -1, -1))
        y = (y1 + y2 + y3 + y4.view_as(y3)).transpose(1, 2).reshape(B, T, D)
        return self.o(y)


def attn_variants(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return AttnVariants(), (torch.randn(2, 8, 32), torch.randn(2, 5, 32)), None


def shared_inputs(device: str = "cpu") -> Case:
    """nn.MultiheadAttention self-attention called as mha(x, x, x): one tensor passed three times.
    MHA checks ``query is key is value`` and then does ONE packed in-projection; with three
    distinct tensors it does three."""
    torch.manual_seed(0)
    with torch.device(device):
        mha = nn.MultiheadAttention(16, 4, batch_first=True)
        x = torch.randn(2, 5, 16)
    return mha, (x, x, x), lambda out: out[0].mean()


def sliced_input(device: str = "cpu") -> Case:
    """The input is a view (a column slice) of a larger tensor; Linear saves it for backward,
    so autograd keeps the whole base storage alive."""
    torch.manual_seed(0)
    with torch.device(device):
        big = torch.randn(12, 40)
        return nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 2)), big[:, 8:24], None


class Bags(nn.Module):
    """nn.EmbeddingBag in its three modes (mean and max bags keep an ``offset2bag`` index per input
    index for backward; the CPU kernel sizes its storage one element longer than the tensor), one
    with per-sample weights and a padding index, then a linear head."""

    def __init__(self, rows: int = 40, d: int = 16):
        super().__init__()
        self.mean = nn.EmbeddingBag(rows, d, mode="mean")
        self.max = nn.EmbeddingBag(rows, d, mode="max")
        self.sum = nn.EmbeddingBag(rows, d, mode="sum", padding_idx=0)
        self.head = nn.Linear(d, 3)

    def forward(self, ids, offsets, weights):
        h = self.mean(ids, offsets) + self.max(ids, offsets)  # (bags, d)
        h = h + self.sum(ids, offsets, per_sample_weights=weights)
        return self.head(torch.tanh(h))  # (bags, 3)


def bags(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        ids = torch.randint(0, 40, (21,))
        return Bags(), (ids, torch.tensor([0, 4, 9, 15]), torch.rand(21)), None


class TransposedGrads(nn.Module):
    """Gradients that reach a norm or loss kernel transposed: a pooler over the tokens of a residual
    block's final LayerNorm (Swin's), BatchNorm1d over a transposed sequence, log-softmax read
    through a transpose (CTC's time-major log-probabilities), an MSE loss of a transposed tensor.
    The kernels allocate their grad_input contiguous (batch norm: in the input's memory format),
    not in the gradient's layout; the MSE loss keeps its elementwise storage."""

    def __init__(self, d: int = 24, classes: int = 10):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.ln1, self.fc, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.ln = nn.LayerNorm(d)
        self.bn = nn.BatchNorm1d(d)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(d, classes)

    def forward(self, x):  # x: (B, L, d)
        h0 = self.proj(x)
        h = self.ln(h0 + self.fc2(F.gelu(self.fc(self.ln1(h0)))))  # (B, L, d)
        pooled = self.pool(h.transpose(1, 2)).flatten(1)  # (B, d): the gradient into ln is transposed
        s = self.bn(self.proj(x).transpose(1, 2)).transpose(1, 2)  # (B, L, d) through (B, d, L)
        logp = F.log_softmax(self.head(s + pooled[:, None]), -1).transpose(0, 1)  # (L, B, classes)
        return logp.reshape(-1, logp.shape[-1]).sum(-1).mean() + F.mse_loss(h.transpose(1, 2), torch.zeros_like(h).mT)


def transposed_grads(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return TransposedGrads(), torch.randn(4, 16, 24), lambda out: out


class PackedLSTM(nn.Module):
    """Variable-length sequences through nn.utils.rnn: pack_padded_sequence (unsorted lengths), a
    2-layer bidirectional LSTM on the PackedSequence, pad_packed_sequence back."""

    def __init__(self, vocab: int = 20, d: int = 8, hidden: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(2 * hidden, 3)

    def forward(self, ids, lengths):  # ids: (B, T), lengths: (B,)
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(ids), lengths, batch_first=True, enforce_sorted=False)
        rows, _ = self.rnn(packed)  # rows.data: (sum(lengths), 2 * hidden)
        padded, _ = nn.utils.rnn.pad_packed_sequence(rows, batch_first=True)  # (B, max(lengths), 2 * hidden)
        return self.out(padded.mean(1))


def packed_lstm(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        model = PackedLSTM()
    return model, (torch.randint(0, 20, (3, 7)), torch.tensor([4, 7, 2])), None  # lengths stay on the CPU


class Unused(nn.Module):
    """A trainable parameter that receives no gradient in this step (a layer used under no_grad)."""

    def __init__(self):
        super().__init__()
        self.teacher = nn.Linear(8, 8)
        self.student = nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():
            target = self.teacher(x)
        return F.mse_loss(self.student(x), target)


def unused_param(device: str = "cpu") -> Case:
    torch.manual_seed(0)
    with torch.device(device):
        return Unused(), torch.randn(4, 8), None


def hf_mixtral(device: str = "cpu") -> Case:
    """Mixtral MoE (4 experts, top-2): transformers runs the experts with F.grouped_mm."""
    model = _hf("mixtral", "AutoModelForCausalLM", device=device, vocab_size=128, hidden_size=64,
                intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    return model, _on(device, {"input_ids": ids, "labels": ids.clone()}), None


# name -> builder
ZOO: dict[str, Callable[..., Case]] = {
    "cruncher": cruncher,
    "mlp": mlp,
    "vgg": vgg,
    "gpt": gpt,
    "gpt_bf16": gpt_bf16,
    "vgg_channels_last": vgg_channels_last,
    "hf_gpt2": hf_gpt2,
    "hf_bert": hf_bert,
    "hf_bert_unpadded": hf_bert_unpadded,
    "hf_llama_sdpa": hf_llama_sdpa,
    "hf_llama_eager": hf_llama_eager,
    "hf_t5": hf_t5,
    "hf_mixtral": hf_mixtral,
    "lstm": lstm,
    "gru": gru,
    "lstm_bidir": lstm_bidir,
    "convs": convs,
    "attn_variants": attn_variants,
    "mobilenet": mobilenet,
    "branchy": branchy,
    "checkpoint_reentrant": checkpoint_reentrant,
    "checkpoint_nonreentrant": checkpoint_nonreentrant,
    "dict_inputs": dict_inputs,
    "tied": tied,
    "frozen": frozen,
    "shared_inputs": shared_inputs,
    "sliced_input": sliced_input,
    "unused_param": unused_param,
    "bags": bags,
    "transposed_grads": transposed_grads,
    "packed_lstm": packed_lstm,
}
HF = {name for name in ZOO if name.startswith("hf_")}
# builders whose model and inputs can be built on the meta device
META_OK = {"cruncher", "mlp", "vgg", "gpt", "gpt_bf16", "vgg_channels_last", "branchy", "lstm", "gru", "mobilenet", "checkpoint_reentrant",
           "checkpoint_nonreentrant", "dict_inputs", "tied", "frozen", "lstm_bidir", "convs",
           "attn_variants", "hf_gpt2", "hf_bert", "hf_llama_sdpa", "hf_t5"}
