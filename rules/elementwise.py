"""Elementwise ops, activations and their backward, dropout, and optimizer ops (OTHER).

Convention (the whole project): the cost of an elementwise op is a fixed number
of FLOPs per output element, the number of scalar operations its kernel does:
each add, subtract, multiply, divide, comparison, select, min/max is 1 FLOP,
and so is each transcendental or special function (exp, log, tanh, sigmoid,
erf, sqrt, rsqrt, pow...), counted once like an add.  Broadcasting counts the
output elements.  ``out=`` variants are overloads of their op's packet; in-place
ops (``add_``) are packets of their own that get the same rule (``aten_ops``
registers both); the ``_foreach_*`` list ops cost the same per element, summed
over the list.

Each table line below is one op: ``name: (FLOPs per element, what they are)``;
the rule's formula (its docstring's first line) is generated from that line.
"""

from __future__ import annotations

from .registry import OTHER, TensorSpec, aten_ops, register, register_zero

# -- math helpers ------------------------------------------------------------


def elementwise_flops(numel: int, per_element: int) -> int:
    """FLOPs of ``per_element`` scalar operations on each of ``numel`` elements."""
    return numel * per_element


def list_numel(tensors) -> int:
    """Total elements of a tensor list (a ``_foreach`` operand)."""
    return sum(t.numel for t in tensors if isinstance(t, TensorSpec))


def _is_one(x) -> bool:
    try:
        return x is None or float(x) == 1.0
    except (TypeError, ValueError):  # a tensor alpha/value: a real multiply
        return False


def _foreach_list(call):
    """The tensor list a ``_foreach`` op iterates over (``self``, or the first list argument)."""
    for value in call.args.values():
        if isinstance(value, tuple) and value and isinstance(value[0], TensorSpec):
            return value
    return ()


# -- table-driven rules (fvcore jit_handles style) ---------------------------


def per_element(flops: int, why: str):
    """A rule: ``flops`` FLOPs per output element (``why`` says which operations)."""

    def rule(call):
        return elementwise_flops(call.out.numel, flops)

    rule.__doc__ = f"{flops} FLOP{'s' if flops != 1 else ''} per output element: {why}."
    return rule


def _grad(call):
    """The incoming gradient of a backward op (``grad_output``, or ``grad_out`` in some schemas)."""
    grad = call.get("grad_output")
    return grad if grad is not None else call["grad_out"]


def per_grad_element(flops: int, why: str):
    """A rule for a backward op: ``flops`` FLOPs per element of its incoming gradient."""

    def rule(call):
        return elementwise_flops(_grad(call).numel, flops)

    rule.__doc__ = f"{flops} FLOP{'s' if flops != 1 else ''} per grad_output element: {why}."
    return rule


def register_table(table: dict[str, tuple[int, str]], factory=per_element) -> None:
    """Register one rule per line of ``table``; op names this torch lacks are skipped."""
    for name, (flops, why) in table.items():
        ops = aten_ops(name)
        if ops:
            rule = factory(flops, why)
            rule.__name__ = rule.__qualname__ = name
            register(*ops, kind=OTHER)(rule)


UNARY = {
    # name: (FLOPs per output element, what they are)
    "abs": (1, "|x|"),
    "absolute": (1, "|x|"),
    "neg": (1, "-x"),
    "negative": (1, "-x"),
    "sign": (1, "sign(x)"),
    "sgn": (1, "sign(x)"),
    "signbit": (1, "x < 0"),
    "reciprocal": (1, "1/x"),
    "square": (1, "x*x"),
    "sqrt": (1, "sqrt(x), a transcendental counted once"),
    "rsqrt": (1, "1/sqrt(x), a transcendental counted once"),
    "exp": (1, "exp(x)"),
    "exp2": (1, "2**x"),
    "expm1": (1, "exp(x) - 1"),
    "log": (1, "log(x)"),
    "log2": (1, "log2(x)"),
    "log10": (1, "log10(x)"),
    "log1p": (1, "log(1 + x)"),
    "sin": (1, "sin(x)"),
    "cos": (1, "cos(x)"),
    "tan": (1, "tan(x)"),
    "asin": (1, "asin(x)"),
    "acos": (1, "acos(x)"),
    "atan": (1, "atan(x)"),
    "arcsin": (1, "asin(x)"),
    "arccos": (1, "acos(x)"),
    "arctan": (1, "atan(x)"),
    "sinh": (1, "sinh(x)"),
    "cosh": (1, "cosh(x)"),
    "tanh": (1, "tanh(x)"),
    "asinh": (1, "asinh(x)"),
    "acosh": (1, "acosh(x)"),
    "atanh": (1, "atanh(x)"),
    "arcsinh": (1, "asinh(x)"),
    "arccosh": (1, "acosh(x)"),
    "arctanh": (1, "atanh(x)"),
    "sigmoid": (1, "sigmoid(x), a special function counted once"),
    "erf": (1, "erf(x)"),
    "erfc": (1, "erfc(x)"),
    "erfinv": (1, "erfinv(x)"),
    "lgamma": (1, "lgamma(x)"),
    "digamma": (1, "digamma(x)"),
    "polygamma": (1, "polygamma(n, x)"),
    "i0": (1, "i0(x)"),
    "special_i0e": (1, "exp(-|x|) i0(x)"),
    "special_i1": (1, "i1(x) (i0's derivative)"),
    "special_i1e": (1, "exp(-|x|) i1(x)"),
    "special_ndtri": (1, "the normal quantile"),
    "special_erfcx": (1, "exp(x^2) erfc(x)"),
    "special_log_ndtr": (1, "log of the normal CDF"),
    "special_entr": (1, "-x log(x)"),
    "sinc": (1, "sin(pi x)/(pi x), a special function counted once"),
    "floor": (1, "floor(x)"),
    "ceil": (1, "ceil(x)"),
    "round": (1, "round(x)"),
    "trunc": (1, "trunc(x)"),
    "fix": (1, "trunc(x)"),
    "frac": (1, "x - trunc(x)"),
    "relu": (1, "max(x, 0)"),
    "logical_not": (1, "not x"),
    "bitwise_not": (1, "~x"),
    "isnan": (1, "x != x"),
    "isinf": (1, "|x| == inf"),
    "isfinite": (1, "a finiteness test"),
    "isposinf": (1, "x == inf"),
    "isneginf": (1, "x == -inf"),
    "nan_to_num": (3, "three tests and selects (nan, +inf, -inf)"),
    "deg2rad": (1, "x * pi/180"),
    "rad2deg": (1, "x * 180/pi"),
    "angle": (1, "atan2(imag, real)"),
    "conj_physical": (1, "negate the imaginary part"),
    "logit": (3, "log(x / (1 - x)): sub, div, log"),
}

BINARY = {
    "mul": (1, "a * b"),
    "multiply": (1, "a * b"),
    "true_divide": (1, "a / b"),
    "divide": (1, "a / b"),
    "floor_divide": (2, "floor(a / b)"),
    "remainder": (1, "a mod b"),
    "fmod": (1, "a mod b"),
    "pow": (1, "a ** b, a transcendental counted once"),
    "igamma": (1, "the regularized lower incomplete gamma function, a special function counted once"),
    "igammac": (1, "the regularized upper incomplete gamma function, a special function counted once"),
    "float_power": (1, "a ** b in double"),
    "maximum": (1, "max(a, b)"),
    "minimum": (1, "min(a, b)"),
    "fmax": (1, "max(a, b) ignoring nan"),
    "fmin": (1, "min(a, b) ignoring nan"),
    "clamp_min": (1, "max(x, min)"),
    "clamp_max": (1, "min(x, max)"),
    "eq": (1, "a == b"),
    "ne": (1, "a != b"),
    "lt": (1, "a < b"),
    "le": (1, "a <= b"),
    "gt": (1, "a > b"),
    "ge": (1, "a >= b"),
    "not_equal": (1, "a != b"),
    "less": (1, "a < b"),
    "less_equal": (1, "a <= b"),
    "greater": (1, "a > b"),
    "greater_equal": (1, "a >= b"),
    "logical_and": (1, "a and b"),
    "logical_or": (1, "a or b"),
    "logical_xor": (1, "a xor b"),
    "bitwise_and": (1, "a & b"),
    "bitwise_or": (1, "a | b"),
    "bitwise_xor": (1, "a ^ b"),
    "bitwise_left_shift": (1, "a << b"),
    "bitwise_right_shift": (1, "a >> b"),
    "__and__": (1, "a & b"),
    "__or__": (1, "a | b"),
    "__xor__": (1, "a ^ b"),
    "__lshift__": (1, "a << b"),
    "__rshift__": (1, "a >> b"),
    "__iand__": (1, "a & b"),
    "__ior__": (1, "a | b"),
    "__ixor__": (1, "a ^ b"),
    "__ilshift__": (1, "a << b"),
    "__irshift__": (1, "a >> b"),
    "atan2": (1, "atan2(a, b)"),
    "arctan2": (1, "atan2(a, b)"),
    "hypot": (4, "sqrt(a*a + b*b): 2 mul, add, sqrt"),
    "polar": (4, "abs*cos(angle) + i*abs*sin(angle): cos, sin, 2 mul (Llama 4's rotary)"),
    "copysign": (1, "|a| with the sign of b"),
    "xlogy": (2, "x * log(y)"),
    "heaviside": (1, "a step function select"),
    "nextafter": (1, "next float after a towards b"),
    "logaddexp": (5, "max(a, b) + log1p(exp(-|a - b|)): sub, abs, exp, log1p, add"),
    "logaddexp2": (5, "the base-2 logaddexp"),
    "ldexp": (2, "a * 2**b"),
    "gcd": (1, "gcd(a, b)"),
    "lcm": (1, "lcm(a, b)"),
    "where": (1, "one select"),
    "masked_fill": (1, "one select"),
    "threshold": (1, "x > threshold ? x : value (one select)"),
    "lerp": (3, "a + w * (b - a): sub, mul, add"),
    "addcmul": (3, "self + value * t1 * t2: 2 mul, add (value=1 counted alike)"),
    "addcdiv": (3, "self + value * t1 / t2: div, mul, add (value=1 counted alike)"),
    "_add_relu": (2, "max(a + b, 0)"),
}

ACTIVATIONS = {
    "silu": (2, "x * sigmoid(x)"),
    "mish": (4, "x * tanh(log1p(exp(x))): exp, log1p, tanh, mul"),
    "softplus": (5, "x*beta > threshold ? x : log1p(exp(x*beta))/beta: mul, compare, exp, log1p, div"),
    "elu": (6, "x > 0 ? scale*x : scale*alpha*(exp(x*input_scale) - 1): compare, 2 mul, exp, sub, mul"),
    "celu": (6, "the elu kernel with alpha and 1/alpha"),
    "selu": (6, "the elu kernel with the selu constants"),
    "leaky_relu": (2, "x > 0 ? x : slope*x: compare, mul"),
    "rrelu_with_noise": (2, "x > 0 ? x : noise*x: compare, mul (noise drawing not counted)"),
    "hardtanh": (2, "min(max(x, lo), hi)"),
    "relu6": (2, "min(max(x, 0), 6)"),
    "hardsigmoid": (4, "min(max(x + 3, 0), 6) / 6: add, max, min, div"),
    "hardswish": (5, "x * min(max(x + 3, 0), 6) / 6: add, max, min, mul, div"),
    "hardshrink": (2, "|x| > lambda ? x : 0: abs-compare, select"),
    "softshrink": (3, "x > l ? x - l : x < -l ? x + l : 0: 2 compares, add/sub"),
    "log_sigmoid_forward": (6, "min(x, 0) - log1p(exp(-|x|)): abs, neg, exp, log1p, min, sub"),
    # (seen undecomposed where a tensor subclass's handler calls F.logsigmoid: torch's ring attention merge)
    "log_sigmoid": (6, "min(x, 0) - log1p(exp(-|x|)): abs, neg, exp, log1p, min, sub"),
    "_prelu_kernel": (2, "x > 0 ? x : w*x: compare, mul"),
    "glu": (2, "a * sigmoid(b) on the two halves: sigmoid, mul"),
}

BACKWARD = {
    # name: (FLOPs per grad_output element, what they are)
    "threshold_backward": (1, "x > threshold ? grad : 0 (one select)"),
    "sigmoid_backward": (3, "grad * y * (1 - y): sub, 2 mul"),
    "tanh_backward": (3, "grad * (1 - y*y): mul, sub, mul"),
    "silu_backward": (6, "grad * s * (1 + x*(1 - s)), s = sigmoid(x): sigmoid, sub, mul, add, 2 mul"),
    "mish_backward": (10, "grad * (t + x*s*(1 - t*t)), t = tanh(softplus(x)), s = sigmoid(x): 4 + 6"),
    "softplus_backward": (6, "grad * z / (z + 1), z = exp(x*beta), with the threshold: mul, exp, add, div, mul, select"),
    "elu_backward": (4, "grad * (x > 0 ? scale : negcoef*exp(..)): compare, exp, 2 mul"),
    "leaky_relu_backward": (2, "x > 0 ? grad : slope*grad: compare, mul"),
    "rrelu_with_noise_backward": (1, "grad * noise"),
    "hardtanh_backward": (2, "lo < x < hi ? grad : 0: 2 compares"),
    "hardsigmoid_backward": (3, "-3 < x < 3 ? grad/6 : 0: 2 compares, mul"),
    "hardswish_backward": (5, "x < -3 ? 0 : x <= 3 ? grad*(x/3 + 0.5) : grad: 2 compares, div, add, mul"),
    "hardshrink_backward": (2, "|x| > lambda ? grad : 0: abs-compare, select"),
    "softshrink_backward": (2, "|x| > lambda ? grad : 0: abs-compare, select"),
    "log_sigmoid_backward": (4, "grad * (1 - sigmoid(x)) via the saved buffer: compare, sub, div, mul"),
    "logit_backward": (3, "grad / (x * (1 - x)): sub, mul, div"),
    "glu_backward": (6, "d a = grad*s, d b = grad*a*s*(1 - s), s = sigmoid(b): sigmoid, mul, sub, 3 mul"),
    "_prelu_kernel_backward": (4, "grad_x = x > 0 ? grad : w*grad; grad_w = x > 0 ? 0 : x*grad"),
    "native_dropout_backward": (2, "grad * mask * scale"),
}

register_table(UNARY)
register_table(BINARY)
register_table(ACTIVATIONS)
register_table(BACKWARD, per_grad_element)


# -- rules whose cost depends on an argument ---------------------------------


@register(*aten_ops("add", "sub", "subtract", "rsub"), kind=OTHER)
def add(call):
    """1 FLOP per output element (a + b); 2 when alpha != 1 (a + alpha*b)."""
    return elementwise_flops(call.out.numel, 1 if _is_one(call.get("alpha")) else 2)


@register(*aten_ops("div"), kind=OTHER)
def div(call):
    """1 FLOP per output element (a / b); 2 with a rounding_mode (floor/trunc after the divide)."""
    return elementwise_flops(call.out.numel, 1 if call.get("rounding_mode") is None else 2)


@register(*aten_ops("clamp", "clip"), kind=OTHER)
def clamp(call):
    """1 FLOP per output element per bound given: max(x, min), min(x, max)."""
    bounds = int(call.get("min") is not None) + int(call.get("max") is not None)
    return elementwise_flops(call.out.numel, max(bounds, 1))


@register(*aten_ops("gelu"), kind=OTHER)
def gelu(call):
    """5 FLOPs per element (x/2 * (1 + erf(x/sqrt 2))); 9 with approximate='tanh' (x^3 polynomial + tanh)."""
    # exact: mul, erf, add, 2 mul = 5; tanh: x*x*x 2, *c 1, add 1, *k 1, tanh 1, +1 1, *x 1, *0.5 1 = 9
    return elementwise_flops(call.out.numel, 9 if call.get("approximate") == "tanh" else 5)


@register(*aten_ops("gelu_backward"), kind=OTHER)
def gelu_backward(call):
    """11 FLOPs per grad element (grad * (cdf + x*pdf)); 18 with approximate='tanh'."""
    # exact: cdf 4 (mul, erf, add, mul), pdf 4 (square, mul, exp, mul), x*pdf 1, add 1, *grad 1 = 11
    # tanh: inner 5, tanh 1, 0.5x 1, 1+t 1, 0.5(1+t) 1, 1-t^2 2, inner' 3, product 2, sum*grad 2 = 18
    return elementwise_flops(_grad(call).numel, 18 if call.get("approximate") == "tanh" else 11)


# -- dropout and random masks --------------------------------------------------


# Random generation (the mask's ``bernoulli_`` draw included) is not arithmetic on
# data and is ZERO (see zero.py); what dropout computes with the mask is counted.


@register(*aten_ops("native_dropout", "_fused_dropout"), kind=OTHER)
def native_dropout(call):
    """2 FLOPs per element in training: x * mask * scale (mask drawing not counted; 0 in eval)."""
    if call.get("train") is False:
        return 0
    return elementwise_flops(call.out.numel, 2)


@register(*aten_ops("_masked_scale"), kind=OTHER)
def masked_scale(call):
    """2 FLOPs per element: x * mask * scale."""
    return elementwise_flops(call.out.numel, 2)


# -- optimizer ops: _foreach_* lists and fused optimizers --------------------

FOREACH = {
    # _foreach_<name>: (FLOPs per element of the list, what they are); alpha/value handled below
    "abs": (1, "|x|"), "neg": (1, "-x"), "sign": (1, "sign(x)"), "reciprocal": (1, "1/x"),
    "sqrt": (1, "sqrt(x)"), "rsqrt": (1, "1/sqrt(x)"), "exp": (1, "exp(x)"), "expm1": (1, "exp(x) - 1"),
    "log": (1, "log(x)"), "log1p": (1, "log(1 + x)"), "log2": (1, "log2(x)"), "log10": (1, "log10(x)"),
    "sin": (1, "sin(x)"), "cos": (1, "cos(x)"), "tan": (1, "tan(x)"), "asin": (1, "asin(x)"),
    "acos": (1, "acos(x)"), "atan": (1, "atan(x)"), "sinh": (1, "sinh(x)"), "cosh": (1, "cosh(x)"),
    "tanh": (1, "tanh(x)"), "sigmoid": (1, "sigmoid(x)"), "erf": (1, "erf(x)"), "erfc": (1, "erfc(x)"),
    "lgamma": (1, "lgamma(x)"), "floor": (1, "floor(x)"), "ceil": (1, "ceil(x)"), "round": (1, "round(x)"),
    "trunc": (1, "trunc(x)"), "frac": (1, "x - trunc(x)"),
    "mul": (1, "a * b"), "div": (1, "a / b"), "pow": (1, "a ** b"), "maximum": (1, "max(a, b)"),
    "minimum": (1, "min(a, b)"), "clamp_min": (1, "max(x, min)"), "clamp_max": (1, "min(x, max)"),
    "lerp": (3, "a + w * (b - a)"), "addcmul": (3, "self + value * t1 * t2"),
    "addcdiv": (3, "self + value * t1 / t2"),
    "max": (1, "a max-reduction: one compare per element"),
    "powsum": (2, "sum(|x| ** p): pow, add"),
}


def per_list_element(flops: int, why: str):
    """A rule for a ``_foreach`` op: ``flops`` FLOPs per element of every tensor of the list."""

    def rule(call):
        return elementwise_flops(list_numel(_foreach_list(call)), flops)

    rule.__doc__ = f"{flops} FLOP{'s' if flops != 1 else ''} per element of the tensor list: {why}."
    return rule


for _name, (_flops, _why) in FOREACH.items():
    for _op in aten_ops(f"_foreach_{_name}", f"_foreach_{_name}_"):
        _rule = per_list_element(_flops, _why)
        _rule.__name__ = _rule.__qualname__ = _op.__name__.rpartition(".")[2]
        register(_op, kind=OTHER)(_rule)


@register(*aten_ops("_foreach_add", "_foreach_add_", "_foreach_sub", "_foreach_sub_"), kind=OTHER)
def foreach_add(call):
    """1 FLOP per element of the tensor list (a + b); 2 when alpha != 1 (a + alpha*b)."""
    return elementwise_flops(list_numel(_foreach_list(call)), 1 if _is_one(call.get("alpha")) else 2)


@register(*aten_ops("_foreach_norm"), kind=OTHER)
def foreach_norm(call):
    """sum over the list of the vector norm's FLOPs: 2*numel + 1 per tensor for ord=2 (square, add; sqrt)."""
    from .reduction import vector_norm_flops

    return sum(vector_norm_flops(t.numel, 1, call.get("ord", 2)) for t in _foreach_list(call))


register_zero(*aten_ops("_foreach_copy", "_foreach_copy_", "_foreach_clone", "_foreach_zero", "_foreach_zero_"))


def adam_flops(numel: int, weight_decay: float, amsgrad: bool, decoupled: bool) -> int:
    """Adam/AdamW FLOPs for ``numel`` parameters, counted as its single-tensor ops are here."""
    # exp_avg.lerp_(grad) 3; exp_avg_sq.mul_(b2).addcmul_(grad, grad) 1 + 3;
    # denom = sqrt(v) / bc2_sqrt + eps 3; param.addcdiv_(exp_avg, denom, -step) 3 -> 13
    per = 13
    if amsgrad:
        per += 1  # max_exp_avg_sq = maximum(max_exp_avg_sq, exp_avg_sq)
    if weight_decay:
        per += 1 if decoupled else 2  # AdamW: param.mul_(1 - lr*wd); Adam: grad + wd*param
    return numel * per


@register(*aten_ops("_fused_adam_", "_fused_adam"), kind=OTHER)
def fused_adam(call):
    """(13 + 1 if amsgrad + 2 if weight_decay) FLOPs per parameter element: the Adam update."""
    return adam_flops(list_numel(call["self"]), call["weight_decay"], call["amsgrad"], decoupled=False)


@register(*aten_ops("_fused_adamw_", "_fused_adamw"), kind=OTHER)
def fused_adamw(call):
    """(13 + 1 if amsgrad + 1 if weight_decay) FLOPs per parameter element: the AdamW update."""
    return adam_flops(list_numel(call["self"]), call["weight_decay"], call["amsgrad"], decoupled=True)


def sgd_flops(numel: int, weight_decay: float, momentum: float, nesterov: bool, first_step: bool) -> int:
    """SGD FLOPs for ``numel`` parameters, counted as its single-tensor ops are here."""
    per = 2  # param.add_(grad, alpha=-lr)
    if weight_decay:
        per += 2  # grad + wd*param
    if momentum and not first_step:
        per += 3  # buf.mul_(momentum).add_(grad, alpha=1 - dampening)
    if momentum and nesterov:
        per += 2  # grad + momentum*buf
    return numel * per


@register(*aten_ops("_fused_sgd_", "_fused_sgd"), kind=OTHER)
def fused_sgd(call):
    """(2 + 2 if weight_decay + 3 if momentum (0 on the first step) + 2 if nesterov) FLOPs per parameter element."""
    return sgd_flops(list_numel(call["self"]), call["weight_decay"], call["momentum"],
                     call["nesterov"], call["is_first_step"])


@register(*aten_ops("_fused_adagrad_", "_fused_adagrad"), kind=OTHER)
def fused_adagrad(call):
    """(8 + 2 if weight_decay) FLOPs per parameter element: sum += g*g (3), sqrt + eps (2), addcdiv (3)."""
    per = 8 + (2 if call["weight_decay"] else 0)
    return elementwise_flops(list_numel(call["self"]), per)


@register(*aten_ops("_amp_foreach_non_finite_check_and_unscale_"), kind=OTHER)
def amp_unscale(call):
    """2 FLOPs per gradient element: a finiteness test and the multiply by 1/scale."""
    return elementwise_flops(list_numel(call["self"]), 2)


@register(*aten_ops("_amp_update_scale_", "_amp_update_scale"), kind=OTHER)
def amp_update_scale(call):
    """3 FLOPs: the scalar growth/backoff update of the loss scale (a few scalar ops)."""
    return 3
