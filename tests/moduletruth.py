"""Ground truth for per-module attribution, measured on a REAL CPU training step.

Nothing of the estimator is used (its capture, recorder, rules and tallies are what this checks);
the one shared piece is the FLOP-measuring instrument of :mod:`groundtruth` (``FlopCounterMode``'s
formulas with its three known defects fixed).

What "the module of an op" means, and how it is measured here:

* **forward** (and the loss): the innermost module whose ``forward`` is running when the op is
  dispatched (forward pre/post hooks keep the stack); ops outside the model are ``(loss)``.
* **backward**: the module whose forward *created the autograd node* that runs the op.  A
  ``TorchFunctionMode`` sees every torch call of the forward at the Python level, where the
  outputs already carry their ``grad_fn``: after each call it walks the autograd graph back from
  the outputs and credits every node not yet credited to the module running the call (the walk
  stops at nodes already credited, so each node is credited once, when it is made).  Forward
  post-hooks walk from the module's outputs too, for nodes no torch call returned (custom
  ``autograd.Function``s).  In backward a ``TorchDispatchMode`` asks autograd which node is
  running (``torch._C._current_autograd_node()``) and credits the op to that node's module.
  ``AccumulateGrad`` nodes belong to the module owning the parameter; ops the engine runs outside
  any node (the initial gradient of the loss) to ``(loss)``; recomputation inside backward
  (activation checkpointing) to the module being recomputed.

FLOPs per op are ``FlopCounterMode``'s (matmul-class: mm, addmm, bmm, convolution and its
backward, SDPA ...), one multiply-add = 2 FLOPs.
"""

from __future__ import annotations

import copy
from collections import Counter, defaultdict
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from groundtruth import _call, _loss, flop_counter

LOSS = "(loss)"


class _Credit(TorchFunctionMode):
    """Credits each new autograd node to the module running when the torch call that made it returns."""

    def __init__(self, stack: list[str], owner: dict):
        super().__init__()
        self.stack = stack
        self.owner = owner  # autograd node (its Python object, kept alive here) -> module path

    def credit(self, value: Any, module: str | None = None) -> None:
        module = module if module is not None else (self.stack[-1] if self.stack else LOSS)
        todo = [t.grad_fn for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while todo:
            fn = todo.pop()
            if fn is None or fn in self.owner:
                continue
            self.owner[fn] = module
            todo.extend(nxt for nxt, _ in fn.next_functions)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.credit(out)
        return out


class _Count(TorchDispatchMode):
    """FLOPs and op names per module: forward by the module stack, backward by the running node."""

    def __init__(self, stack: list[str], owner: dict, param_owner: dict[int, str]):
        super().__init__()
        self.stack, self.owner, self.param_owner = stack, owner, param_owner
        self.registry = flop_counter().flop_registry
        self.backward = False
        self.flops = {"forward": Counter(), "backward": Counter()}
        self.ops = {"forward": defaultdict(Counter), "backward": defaultdict(Counter)}
        self.uncredited: list[str] = []

    def module(self) -> str:
        if self.stack:
            return self.stack[-1]
        if not self.backward:
            return LOSS
        fn = torch._C._current_autograd_node()
        if fn is None:
            return LOSS
        if fn in self.owner:
            return self.owner[fn]
        var = getattr(fn, "variable", None)  # AccumulateGrad
        if var is not None and id(var) in self.param_owner:
            return self.param_owner[id(var)]
        self.uncredited.append(type(fn).__name__)
        return "?"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        phase = "backward" if self.backward else "forward"
        module = self.module()
        formula = self.registry.get(func._overloadpacket)
        if formula is not None:
            self.flops[phase][module] += formula(*args, **kwargs, out_val=out)
        self.ops[phase][module][func._overloadpacket.__name__] += 1
        return out


def measure_modules(model: torch.nn.Module, inputs: Any, loss_fn: Callable | None = None,
                    seed: int = 0) -> dict[str, Any]:
    """Per-module matmul-class FLOPs and op counts, forward and backward, of one real step on a copy.

    Returns ``{"forward": {path: flops}, "backward": {path: flops}, "forward_ops": {path: Counter},
    "backward_ops": {path: Counter}, "uncredited": [node types]}``; paths as ``named_modules()``
    gives them (``""`` the root), plus ``(loss)``.
    """
    m = copy.deepcopy(model)
    x = copy.deepcopy(inputs)
    m.train()
    paths = {id(mod): path for path, mod in m.named_modules()}
    param_owner = {id(p): name.rpartition(".")[0] for name, p in m.named_parameters()}
    stack: list[str] = []
    owner: dict = {}
    credit = _Credit(stack, owner)
    count = _Count(stack, owner, param_owner)

    def pre(mod, _args):
        stack.append(paths[id(mod)])

    def post(mod, _args, output):
        credit.credit(output, stack[-1])
        stack.pop()  # also when non-reentrant checkpointing stops a recomputation early (an exception)

    handles = []
    for mod in m.modules():
        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post, always_call=True))  # also when recomputation stops early
    torch.manual_seed(seed)
    try:
        with credit, count:
            loss = _loss(_call(m, x), loss_fn)
            credit.credit(loss, LOSS)
            count.backward = True
            loss.backward()
    finally:
        for h in handles:
            h.remove()
    return {
        "forward": {k: v for k, v in count.flops["forward"].items() if v},
        "backward": {k: v for k, v in count.flops["backward"].items() if v},
        "forward_ops": dict(count.ops["forward"]),
        "backward_ops": dict(count.ops["backward"]),
        "uncredited": count.uncredited,
    }
