"""The torchvision and timm half of the zoo sweep's fixed subset: one model per architecture family, built by
the ``torchvision:`` and ``timm:`` loaders (random weights on the meta device), estimated on the CPU target
(fp32, AdamW) and compared with a real CPU step of the same model measured in the same test
(``tests/sweep.py``: parameters, buffers, gradients, AdamW state, activations held at backward, matmul FLOPs
forward and backward).  Every number must be equal.

The inputs are smaller than the sweep's (``benchmarks/zoo_sweep_torchvision.md``: the weights' own sizes,
800 x 800 for detection) so that the real steps take seconds; the layers are the models' own.  torchvision
comes from the test extras (PyPI's wheel, imported beside the CPU torch as ``sweep.import_torchvision``
says), so these run in CI; without torchvision they skip.
"""

from __future__ import annotations

import pytest

from sweep import sweep_spec

try:
    from sweep import import_torchvision

    import_torchvision()
except ImportError:
    pytest.skip("torchvision is not installed (pip install -e '.[test]' installs it)", allow_module_level=True)

# spec -> (the loader's options, what the family adds)
FAMILIES = {
    "torchvision:resnet18": ({"image_size": 64}, "residual CNN with batch norm"),
    "torchvision:mobilenet_v3_small": ({"image_size": 64}, "depthwise convolutions, squeeze-excitation, hardswish"),
    "torchvision:lraspp_mobilenet_v3_large": ({"image_size": 64}, "segmentation: per-pixel loss on upsampled logits"),
    "torchvision:r3d_18": ({"image_size": 32, "seq": 4}, "video: 3-D convolutions on a 4-frame clip"),
    "torchvision:retinanet_resnet50_fpn": (
        {"image_size": 128, "overrides": ["min_size=128", "max_size=128"]},
        "detection: the transform's random size draw and anchors matched to the target boxes, on known values"),
    "torchvision:raft_small": ({"image_size": 128}, "optical flow on image pairs, a correlation pyramid"),
    "torchvision:swin_t": ({"image_size": 64}, "shifted-window attention with a relative position bias"),
    "timm:vit_tiny_patch16_224": ({}, "timm's vision transformer"),
    "timm:efficientnet_b0": ({"image_size": 64}, "timm's efficient net: depthwise, squeeze-excitation, SiLU"),
}


@pytest.mark.parametrize("spec", sorted(FAMILIES))
def test_every_number_equals_a_real_step(spec):
    if spec.startswith("timm:"):
        pytest.importorskip("timm")
    options, _ = FAMILIES[spec]
    rec = sweep_spec(spec, **options)
    assert rec["outcome"] == "exact", (rec.get("message"), rec.get("errors"))


def test_a_detector_with_known_target_values_is_traced_on_fake_tensors():
    """RetinaNet's training step reads values only where they come from the inputs (the transform's size
    draw, the anchors' match with the target boxes): traced on fake tensors, without the real-tensor
    fallback that would hold its weights (it fell back until float inputs kept their values)."""
    from estimator import estimate
    from estimator.specs import load_spec

    loaded = load_spec("torchvision:retinanet_resnet50_fpn", batch=2, image_size=128,
                       overrides=["min_size=128", "max_size=128"])
    d = estimate(loaded.model, loaded.inputs, loss_fn=loaded.loss_fn, device="cpu").to_dict()
    assert d["capture"] == "fake" and d["capture_fallback"] is None


def test_an_r_cnn_without_torchvisions_operators_is_refused_naming_the_build_to_install():
    """Beside the CPU torch, PyPI's torchvision imports (conftest) but its C++ operators do not load: the R-CNNs,
    whose training step runs the RPN's NMS and RoI align, are refused in one line naming the CPU build; where
    the operators load, the model builds."""
    from estimator.compat import torchvision_has_ops
    from estimator.errors import UserError
    from estimator.specs import load_spec
    from estimator.specs.vision import matching_torchvision

    if torchvision_has_ops():
        assert load_spec("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn").model is not None
        return
    with pytest.raises(UserError) as err:
        load_spec("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn")
    assert "\n" not in str(err.value) and "C++ operators" in str(err.value)
    assert str(err.value).endswith(matching_torchvision())
