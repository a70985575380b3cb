"""Receptive fields read from a graph: exact for architectures other than the bundled voice's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tts_service.piper.receptive import Reach, UnsupportedGraph, graph_reach, measure_reach


def _decoder(layers: list[tuple[str, int, int, int, int]], channels: int = 4) -> onnx.ModelProto:
    """A toy decoder: (op, kernel, stride, dilation, pad) per layer, a residual sum after the first
    conv (two branches of different reach, like HiFi-GAN's multi-receptive-field blocks)."""
    rng = np.random.default_rng(1)
    nodes, inits, x = [], [], "x"
    for i, (op, k, s, d, pad) in enumerate(layers):
        shape = (channels, channels, k)
        inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, f"w{i}"))
        attrs = {"kernel_shape": [k], "strides": [s], "dilations": [d], "pads": [pad, pad]}
        nodes.append(helper.make_node(op, [x, f"w{i}"], [f"c{i}"], **attrs))
        nodes.append(helper.make_node("Tanh", [f"c{i}"], [f"t{i}"]))
        x = f"t{i}"
        if i == 0:  # a wider parallel branch, summed back in
            inits.append(numpy_helper.from_array(rng.standard_normal((channels, channels, 5)).astype(np.float32), "wb"))
            nodes.append(helper.make_node("Conv", [x, "wb"], ["b"], kernel_shape=[5], dilations=[3], pads=[6, 6]))
            nodes.append(helper.make_node("Add", [x, "b"], ["s0"]))
            x = "s0"
    inits.append(numpy_helper.from_array(rng.standard_normal((1, channels, 1)).astype(np.float32), "wo"))
    nodes.append(helper.make_node("Conv", [x, "wo"], ["y"], kernel_shape=[1]))
    graph = helper.make_graph(
        nodes,
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, None])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


ARCHS = {
    "like medium (8, 8, 4)": [("Conv", 7, 1, 1, 3), ("ConvTranspose", 16, 8, 1, 4), ("ConvTranspose", 8, 4, 1, 2)],
    "like low (8, 4)": [("Conv", 5, 1, 1, 2), ("ConvTranspose", 16, 8, 1, 4), ("ConvTranspose", 4, 4, 1, 0)],
    "dilated, asymmetric": [("Conv", 3, 1, 4, 2), ("ConvTranspose", 6, 2, 1, 1), ("Conv", 9, 1, 2, 3)],
}


@pytest.mark.parametrize("name", list(ARCHS))
def test_graph_reading_matches_measurement_and_windows_are_exact(name: str) -> None:
    model = _decoder(ARCHS[name])
    reach, rate = graph_reach(model.graph, "x", "y")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def run(x: np.ndarray) -> np.ndarray:
        return sess.run(None, {"x": x})[0].reshape(-1)

    assert measure_reach(run, 4, rate) == reach
    # windows decoded with exactly that context give the whole decode's samples
    z = np.random.default_rng(2).standard_normal((1, 4, 90)).astype(np.float32)
    whole = run(z)
    parts = []
    for start in range(0, 90, 7):
        end = min(90, start + 7)
        lo, hi = max(0, start - reach.left), min(90, end + reach.right)
        parts.append(run(z[:, :, lo:hi])[(start - lo) * rate : (end - lo) * rate])
    np.testing.assert_allclose(np.concatenate(parts), whole, atol=1e-5)
    # and one frame less on a side is not enough (the reading is tight, not just safe)
    short = Reach(max(0, reach.left - 1), reach.right)
    lo = 40 - short.left
    cut = run(z[:, :, lo : 47 + short.right])[(40 - lo) * rate : 7 * rate + (40 - lo) * rate]
    assert reach.left == 0 or np.max(np.abs(cut - whole[40 * rate : 47 * rate])) > 1e-5


def test_an_unknown_node_on_the_time_axis_is_refused() -> None:
    model = _decoder(ARCHS["like low (8, 4)"])
    model.graph.node.insert(0, helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]))
    model.graph.node[1].input[0] = "xt"
    with pytest.raises(UnsupportedGraph, match="Transpose"):
        graph_reach(model.graph, "x", "y")
