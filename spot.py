# spot checks: estimator activations / peak vs the tests' instruments (groundtruth.measure, livetracker.measure_peaks)
import sys; sys.path.insert(0, "/tmp/fuzz_base/tests"); sys.path.insert(0, "/tmp/fuzzAE")
import torch, copy
torch.set_num_threads(1)
from estimator import estimate
from estimator.compat import import_torchvision; import_torchvision()
from groundtruth import measure, default_loss
from livetracker import measure_peaks
import timm, transformers
from transformers import AutoConfig
def hf(mt, auto, inputs, **kw):
    torch.manual_seed(0); return getattr(transformers, auto).from_config(AutoConfig.for_model(mt, **kw)), inputs
ids = {"input_ids": torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0)), "labels": torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))}
s2s = {"input_ids": ids["input_ids"], "labels": ids["labels"][:, :8]}
D = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
def tm(name, sz=64, **kw):
    torch.manual_seed(0); return timm.create_model(name, pretrained=False, num_classes=10, **kw), torch.randn(2, 3, sz, sz)
cases = {
 "timm:efficientnet_b0": lambda: tm("efficientnet_b0"),
 "timm:vit_tiny": lambda: tm("vit_tiny_patch16_224", img_size=64),
 "timm:convnext_atto": lambda: tm("convnext_atto"),
 "timm:ghostnet_100": lambda: tm("ghostnet_100"),
 "hf:llama": lambda: hf("llama", "AutoModelForCausalLM", ids, **D),
 "hf:mixtral": lambda: hf("mixtral", "AutoModelForCausalLM", ids, **D, num_local_experts=4, num_experts_per_tok=2),
 "hf:switch": lambda: hf("switch_transformers", "AutoModelForSeq2SeqLM", s2s, vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, num_experts=4, encoder_sparse_step=1, decoder_sparse_step=1, decoder_start_token_id=0, pad_token_id=0),
 "hf:bert": lambda: hf("bert", "AutoModelForMaskedLM", ids, **{k: v for k, v in D.items() if k != "num_key_value_heads"}),
}
sel = sys.argv[1:]
for name, b in cases.items():
    if sel and name not in sel: continue
    m, x = b()
    for prec, amp in (("fp32", None), ("bf16-mixed", torch.bfloat16)):
        d = estimate(m, x, device="cpu", precision=prec).to_dict()["memory"]
        mm = copy.deepcopy(m)
        pk = measure_peaks(mm, x, lambda p: torch.optim.AdamW(p, lr=1e-3), default_loss, autocast_dtype=amp, steps=2)
        line = f"{name:22s} {prec:10s} peak est {d['peak']} truth {pk[1]} ({(d['peak']-pk[1])/pk[1]*100:+.2f}%)  1st est {d['peak_first_step']} truth {pk[0]} ({(d['peak_first_step']-pk[0])/pk[0]*100:+.2f}%)"
        if prec == "fp32":
            t = measure(m, x)
            line += f" | act est {d['activations']} truth {t['activation_bytes']} ({(d['activations']-t['activation_bytes'])/max(1,t['activation_bytes'])*100:+.2f}%)"
        print(line, flush=True)
