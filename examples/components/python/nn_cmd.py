"""Runs an ONNX model through wasi:nn: a WASI 0.2 command (../nn-cmd.wit).

stdin, little-endian u32s: target (0 cpu, 1 gpu), the model's length and bytes (or 0, then the
length and bytes of a model's name: the model is loaded by name), the number of inputs, then per input: its name's length and bytes, its tensor type (1 f32, 4 i32, 5 i64), its
number of dimensions and the dimensions, its data's length and bytes.
stdout: the number of outputs, then per output its length and bytes (the model's order).
A refused call prints "wasi-nn: <call>: <code>: <message>" on stderr and fails (exit 1).
"""

import struct
import sys

from wit_world import exports
from wit_world.imports import graph, inference, tensor
from componentize_py_types import Err

TYPES = {1: tensor.TensorType.FP32, 4: tensor.TensorType.I32, 5: tensor.TensorType.I64}


class Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def u32(self) -> int:
        (v,) = struct.unpack_from("<I", self.data, self.at)
        self.at += 4
        return v

    def take(self, n: int) -> bytes:
        out = self.data[self.at : self.at + n]
        self.at += n
        return out


def refused(call: str, e: Err) -> None:
    error = e.value
    sys.stderr.write(f"wasi-nn: {call}: {error.code().name}: {error.data()}\n")
    sys.stderr.flush()
    raise SystemExit(1)


class Run(exports.Run):
    def run(self) -> None:
        r = Reader(sys.stdin.buffer.read())
        target = [graph.ExecutionTarget.CPU, graph.ExecutionTarget.GPU][r.u32()]
        model = r.take(r.u32())
        try:
            if model:
                g = graph.load([model], graph.GraphEncoding.ONNX, target)
            else:
                g = graph.load_by_name(r.take(r.u32()).decode())
        except Err as e:
            refused("load", e)
        try:
            context = g.init_execution_context()
        except Err as e:
            refused("init-execution-context", e)
        inputs = []
        for _ in range(r.u32()):
            name = r.take(r.u32()).decode()
            ty = TYPES[r.u32()]
            dims = [r.u32() for _ in range(r.u32())]
            data = r.take(r.u32())
            inputs.append((name, tensor.Tensor(dims, ty, data)))
        try:
            outputs = context.compute(inputs)
        except Err as e:
            refused("compute", e)
        out = [struct.pack("<I", len(outputs))]
        for _, t in outputs:
            data = t.data()
            out.append(struct.pack("<I", len(data)))
            out.append(data)
        sys.stdout.buffer.write(b"".join(out))
        sys.stdout.flush()
