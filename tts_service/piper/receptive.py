"""How many latent frames of context a windowed decoder needs: read from its graph, checked by measurement.

A window ``[start, end)`` decoded with ``left`` frames before it and ``right`` after it gives
exactly the samples a whole decode gives, when ``left``/``right`` cover the decoder's receptive
field. Piper voices come in several architectures (``x_low``/``low``/``medium``/``high``:
different upsampling rates and kernels), so a constant is wrong for some voice; and too much
context is paid on every window of every stream. So we compute the field from the graph, node
by node, and confirm it at load time by perturbing one input frame (:func:`measure_reach`).

Positions are in latent frames. A tensor at *rate* ``r`` has ``r`` elements per latent frame
(the decoder input 1, its audio output 256). Each tensor carries how far (``left``, ``right``)
its elements may depend on input positions before and after their own; a ``Conv`` or
``ConvTranspose`` widens that by its kernel's reach, an elementwise node takes the widest of its
inputs (residual sums, the multi-receptive-field averages).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# Nodes that combine inputs position by position (same rate in, same rate out).
_ELEMENTWISE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where",
    "LeakyRelu", "Relu", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Neg", "Abs", "Clip", "Cast", "Identity", "Erf",
}  # fmt: skip


class UnsupportedGraph(ValueError):
    """The graph has a node whose time reach we cannot read; measure instead."""


@dataclass(frozen=True, slots=True)
class Reach:
    """Context a window needs on each side, in whole latent frames."""

    left: int
    right: int


@dataclass(slots=True)
class _Field:
    rate: float
    left: float
    right: float


def graph_reach(graph, input_name: str, output_name: str) -> tuple[Reach, int]:
    """The receptive field of ``output_name`` over ``input_name`` and the output's rate (samples
    per input frame), from an ``onnx.GraphProto``. Raises :class:`UnsupportedGraph`."""
    from onnx import helper

    fields: dict[str, _Field] = {input_name: _Field(1.0, 0.0, 0.0)}
    for node in graph.node:  # ONNX graphs are topologically sorted
        ins = [fields[i] for i in node.input if i in fields]
        if not ins:
            continue  # weights, shapes, constants: no position dependence
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type in ("Conv", "ConvTranspose"):
            f = _conv(node.op_type, attrs, fields.get(node.input[0]), node.name)
        elif node.op_type in ("Unsqueeze", "Squeeze"):
            f = ins[0]  # adds or drops a unit axis in front of time (the load-time check catches a wrong guess)
        elif node.op_type in _ELEMENTWISE:
            if len({x.rate for x in ins}) != 1:
                raise UnsupportedGraph(f"{node.name}: inputs at different rates")
            f = _Field(ins[0].rate, max(x.left for x in ins), max(x.right for x in ins))
        else:
            raise UnsupportedGraph(f"{node.name}: {node.op_type} on the time axis")
        for out in node.output:
            fields[out] = f
    if output_name not in fields:
        raise UnsupportedGraph(f"{output_name} does not depend on {input_name}")
    f = fields[output_name]
    # Output frame t covers positions [t, t + 1 - 1/rate] and input frame j sits at j, so frame t
    # needs inputs j >= t - left and j <= t + 1 - 1/rate + right: whole frames floor() of each.
    eps = 1e-9
    right = math.floor(f.right + 1.0 - 1.0 / f.rate + eps)
    return Reach(math.floor(f.left + eps), max(0, right)), round(f.rate)


def _conv(op: str, attrs: dict, x: _Field | None, name: str) -> _Field:
    if x is None:
        raise UnsupportedGraph(f"{name}: the time axis reaches the weights")
    kernel = attrs.get("kernel_shape")
    if kernel is None or len(kernel) != 1 or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise UnsupportedGraph(f"{name}: only 1-D convolutions with explicit pads are read")
    k, s = kernel[0], (attrs.get("strides") or [1])[0]
    d, pad = (attrs.get("dilations") or [1])[0], (attrs.get("pads") or [0, 0])[0]
    span = d * (k - 1)  # distance from the first to the last kernel tap, in input elements
    if op == "Conv":
        # output o reads inputs o*s - pad ... o*s - pad + span; o sits at o*s/r
        return _Field(x.rate / s, x.left + pad / x.rate, x.right + (span - pad) / x.rate)
    # ConvTranspose: output o = i*s - pad + m*d (m < k) is written by inputs i = (o + pad - m*d)/s
    rate = x.rate * s
    return _Field(rate, x.left + (span - pad) / rate, x.right + pad / rate)


def measure_reach(run: Callable[[np.ndarray], np.ndarray], channels: int, hop: int, *, frames: int = 64) -> Reach:
    """The receptive field as seen: perturb one frame of a random input and find which output
    frames changed. ``run`` maps a ``[1, channels, T]`` input to ``T * hop`` samples."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, channels, frames)).astype(np.float32)
    centre = frames // 2
    y = x.copy()
    y[:, :, centre] += 1.0
    diff = np.abs(run(y).reshape(-1) - run(x).reshape(-1))
    changed = np.flatnonzero(diff > 0)
    if not len(changed):
        return Reach(0, 0)
    first, last = changed[0] // hop, changed[-1] // hop
    if first == 0 or last == frames - 1:
        raise UnsupportedGraph(f"the receptive field is wider than {frames // 2} frames: measure with more")
    # output frame f depends on the perturbed frame when f - left <= centre <= f + right
    return Reach(left=int(last - centre), right=int(centre - first))
