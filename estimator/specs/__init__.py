"""Turn what the user typed into a model and inputs: one module per SPEC form.

SPEC forms:

* ``path/to/file.py:callable`` or ``package.module:callable`` (:mod:`.callables`): the callable
  returns an ``nn.Module`` (inputs then come from ``--input``) or a ``(module, inputs)`` pair.
  ``--set key=value`` options become keyword arguments of the callable.
* ``hf:MODEL_TYPE`` (``hf:gpt2``, ``hf:llama``), ``hf:path/to/config.json`` (or a folder holding
  one) (:mod:`.hf`, inputs by :mod:`.hf_inputs`): a Hugging Face transformers model from that
  configuration, ``--set key=value`` overriding configuration fields (``--set
  num_hidden_layers=2``).  Inputs: token ids of ``--batch`` x ``--seq`` with labels, so the model
  computes its own loss; images of ``--batch`` x channels x ``--image-size`` squared with class
  labels; speech and vision-language inputs as the model takes them.
* ``torchvision:NAME`` and ``timm:NAME`` (:mod:`.vision`): images and cross-entropy against class
  labels; detection models with synthetic targets.

Library models are built without weights (:func:`estimator.build.empty_weights`): nothing is
downloaded, allocated or initialised, so a 70B configuration builds in seconds.  User factories
are built the same way; one that fails so (it reads weight values while building) is built
again normally.  :mod:`.options` parses shapes, dtypes and ``--set`` values; :mod:`.loader`
dispatches a SPEC to its loader.
"""

from .loader import load, load_spec
from .options import (
    DEFAULT_IMAGE_SIZE, DEFAULT_SEQ, DTYPES, FALLBACK_SEQ, PREFIXES, Loaded, SpecOptions, close_matches, parse_dtype,
    parse_overrides, parse_shape, parse_value, prefix_of,
)
from .vision import classification_loss, detection_inputs, detection_loss, detection_targets

__all__ = [
    "load", "load_spec", "DEFAULT_IMAGE_SIZE", "DEFAULT_SEQ", "DTYPES", "FALLBACK_SEQ", "PREFIXES", "Loaded",
    "SpecOptions", "close_matches", "parse_dtype", "parse_overrides", "parse_shape", "parse_value", "prefix_of",
    "classification_loss", "detection_inputs", "detection_loss", "detection_targets",
]
