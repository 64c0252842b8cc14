#!/usr/bin/env python3
"""Writes the ONNX graph cases of the graph executor's tests, with reference outputs.

Usage: .tools/onnx/bin/python scripts/onnx/graphs.py OUT_DIR

Every case is OUT_DIR/<case>/model.onnx (opset 20, default domain only), its inputs
and ONNX Runtime's outputs as raw little-endian arrays (in0.bin, out0.bin, ...) and
case.json describing them; OUT_DIR/index.json lists the cases and their operators.
OUT_DIR/bad/ holds models an executor must refuse, with bad/index.json saying which
error each one must give; OUT_DIR/slow/model.onnx is a long model (no reference) for
deadline tests. Everything is deterministic: weights and inputs come from
generators seeded by the model's and the case's name. scripts/onnx/README.md has
the formats.
"""

import json
import math
import shutil
import sys
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 20
# The largest tensor a case may hold, so that an interpreter runs every case quickly.
MAX_ELEMENTS = 50_000
DTYPES = {
    np.dtype(np.float32): ("float32", "<f4", TensorProto.FLOAT),
    np.dtype(np.int64): ("int64", "<i8", TensorProto.INT64),
}


def seeded(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


class Graph:
    """One model being built: nodes, initializers, graph inputs and their values.

    Weights come from a generator seeded by the model name, inputs from one seeded
    by the case name, so the cases of a dynamic-batch model share one model.
    """

    def __init__(self, case, model=None):
        self.case = case
        self.weights_rng = seeded(model or case)
        self.inputs_rng = seeded(case)
        self.nodes, self.initializers, self.inputs, self.outputs = [], [], [], []
        self.feeds = {}
        self.count = 0

    def fresh(self, op):
        self.count += 1
        return f"{op.lower()}_{self.count}"

    def input(self, name, value, dims=None):
        """A graph input fed `value`; `dims` declares a shape with dim_params."""
        value = np.asarray(value)
        elem = DTYPES[value.dtype][2]
        self.inputs.append(helper.make_tensor_value_info(name, elem, dims or list(value.shape)))
        self.feeds[name] = value
        return name

    def rand_input(self, name, shape, scale=1.0, dims=None):
        value = (self.inputs_rng.standard_normal(shape) * scale).astype(np.float32)
        return self.input(name, value, dims)

    def const(self, name, value):
        """An initializer holding `value` (numpy array)."""
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name, shape):
        value = (self.weights_rng.standard_normal(shape) * 0.5).astype(np.float32)
        return self.const(name, value)

    def i64(self, name, values):
        return self.const(name, np.array(values, dtype=np.int64))

    def node(self, op, inputs, n_outputs=1, **attrs):
        outs = [self.fresh(op) for _ in range(n_outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=f"{op}_{self.count}", **attrs))
        return outs[0] if n_outputs == 1 else outs

    def output(self, value, dims=None, name="y"):
        """Makes `value` graph output `name`; its shape is `dims` (with dim_params) or inferred."""
        for node in self.nodes:
            for names in (node.input, node.output):
                for i, old in enumerate(names):
                    if old == value:
                        names[i] = name
        self.outputs.append((name, dims))

    def model(self, producer="tensor-wasm scripts/onnx/graphs.py"):
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in self.outputs]
        graph = helper.make_graph(self.nodes, self.case.split("@")[0], self.inputs, outs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name=producer)
        # Declare each output's shape as ONNX shape inference finds it.
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        for out in model.graph.output:
            assert out.type.tensor_type.HasField("shape"), f"{self.case}: no shape inferred for {out.name}"
        onnx.checker.check_model(model, full_check=True)
        return model


def json_lines(entries):
    """A JSON list with one entry a line."""
    return "[\n" + ",\n".join(json.dumps(e) for e in entries) + "\n]\n"


def session(model_bytes):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def tensor_entry(name, value, file):
    dtype, _, _ = DTYPES[value.dtype]
    return {"name": name, "dims": list(value.shape), "dtype": dtype, "file": file}


def write_array(path, value):
    path.write_bytes(value.astype(DTYPES[value.dtype][1]).tobytes())


def write_case(out_dir, g):
    return write_model_case(out_dir, g.case, g.model().SerializeToString(), g.feeds)


def write_model_case(out_dir, case_name, model_bytes, feeds, max_elements=MAX_ELEMENTS, extra=None):
    """Writes OUT_DIR/<case_name>: `model_bytes` as they are, `feeds` and ONNX Runtime's
    outputs, case.json (with the keys of `extra` added); returns the index entry.
    `max_elements` bounds every input, output and initializer (None: no bound)."""
    model = onnx.load_model_from_string(model_bytes)
    names = [o.name for o in model.graph.output]
    results = session(model_bytes).run(names, feeds)
    case_dir = out_dir / case_name
    if case_dir.exists():
        shutil.rmtree(case_dir)
    case_dir.mkdir(parents=True)
    (case_dir / "model.onnx").write_bytes(model_bytes)
    inputs, outputs = [], []
    initializer_names = {i.name for i in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in initializer_names]
    assert sorted(vi.name for vi in graph_inputs) == sorted(feeds), f"{case_name}: feeds {sorted(feeds)}"
    for i, vi in enumerate(graph_inputs):
        write_array(case_dir / f"in{i}.bin", feeds[vi.name])
        inputs.append(tensor_entry(vi.name, feeds[vi.name], f"in{i}.bin"))
    for i, (name, value) in enumerate(zip(names, results)):
        assert value.dtype == np.float32, f"{case_name}: output {name} is {value.dtype}"
        write_array(case_dir / f"out{i}.bin", value)
        outputs.append(tensor_entry(name, value, f"out{i}.bin"))
    for out, value in zip(model.graph.output, results):
        declared = [d.dim_value if d.HasField("dim_value") else None for d in out.type.tensor_type.shape.dim]
        assert len(declared) == value.ndim and all(d in (None, n) for d, n in zip(declared, value.shape)), \
            f"{case_name}: ONNX Runtime's output {out.name} has shape {value.shape}, the model declares {declared}"
    if max_elements is not None:
        tensors = [*feeds.values(), *results, *(numpy_helper.to_array(i) for i in model.graph.initializer)]
        assert max(t.size for t in tensors) <= max_elements, f"{case_name}: a tensor over {max_elements} elements"
    ops = list(dict.fromkeys(n.op_type for n in model.graph.node))
    case = {"name": case_name, "ops": ops, "inputs": inputs, "outputs": outputs, **(extra or {})}
    (case_dir / "case.json").write_text(json.dumps(case) + "\n")
    return {"name": case_name, "ops": ops}


# --- the cases ------------------------------------------------------------------
# Each builder returns a Graph; cases() yields them all, in index order.

BINARY_SHAPES = {
    "same": ([2, 3, 4], [2, 3, 4]),
    "bcast_last": ([2, 3, 4], [4]),
    "bcast_col": ([2, 3, 4], [3, 1]),
    "bcast_both": ([2, 1, 4], [1, 3, 1]),
    "scalar_init": ([2, 3, 4], []),
}


def binary(op, variant):
    a_shape, b_shape = BINARY_SHAPES[variant]
    g = Graph(f"{op.lower()}_{variant}")
    a = g.rand_input("a", a_shape)
    if variant == "scalar_init":
        value = np.array(g.weights_rng.standard_normal() * 0.5, dtype=np.float32)
        if op == "Div":
            value = np.abs(value) + np.float32(0.5)
        b = g.const("b", value.reshape([]))
    elif op == "Div":
        b = g.input("b", (np.abs(g.inputs_rng.standard_normal(b_shape)) + 0.5).astype(np.float32))
    else:
        b = g.rand_input("b", b_shape)
    g.output(g.node(op, [a, b]))
    return g


def unary(op, case=None, scale=3.0, **attrs):
    g = Graph(case or op.lower())
    if op == "Exp":
        x = g.input("x", g.inputs_rng.uniform(-10, 10, [2, 3, 50]).astype(np.float32))
    else:
        x = g.rand_input("x", [2, 3, 50], scale)
    g.output(g.node(op, [x], **attrs))
    return g


def matmul(case, a_shape, b_shape, b_weight=False):
    g = Graph(case)
    a = g.rand_input("a", a_shape)
    b = g.weight("b", b_shape) if b_weight else g.rand_input("b", b_shape)
    g.output(g.node("MatMul", [a, b]))
    return g


def gemm(case, a_shape, b_shape, c_shape=None, **attrs):
    g = Graph(case)
    ins = [g.rand_input("a", a_shape), g.weight("b", b_shape)]
    if c_shape is not None:
        ins.append(g.weight("c", c_shape))
    g.output(g.node("Gemm", ins, **attrs))
    return g


def conv(case, x_shape, w_shape, bias=True, **attrs):
    g = Graph(case)
    ins = [g.rand_input("x", x_shape), g.weight("w", w_shape)]
    if bias:
        ins.append(g.weight("b", [w_shape[0]]))
    g.output(g.node("Conv", ins, kernel_shape=w_shape[2:], **attrs))
    return g


def single(op, case, shape, *, extra=(), **attrs):
    """One node on one random input, then `extra` (callables g -> input name)."""
    g = Graph(case)
    ins = [g.rand_input("x", shape)] + [make(g) for make in extra]
    g.output(g.node(op, ins, **attrs))
    return g


def concat(case, shapes, axis):
    g = Graph(case)
    ins = [g.rand_input(f"x{i}", s) for i, s in enumerate(shapes)]
    g.output(g.node("Concat", ins, axis=axis))
    return g


def gather_const_indices():
    g = Graph("gather_const_indices")
    table = g.weight("table", [10, 4])
    g.output(g.node("Gather", [table, g.i64("indices", [[1, -1], [0, 9]])], axis=0))
    return g


def gather_embedding():
    g = Graph("gather_embedding")
    table = g.weight("table", [10, 4])
    ids = g.input("ids", g.inputs_rng.integers(0, 10, [2, 5]).astype(np.int64))
    g.output(g.node("Gather", [table, ids], axis=0))
    return g


def reduce(op, keepdims):
    g = Graph(f"{op.lower()}_last_keepdims{keepdims}")
    x = g.rand_input("x", [2, 3, 5])
    g.output(g.node(op, [x, g.i64("axes", [-1])], keepdims=keepdims))
    return g


def constant_add():
    g = Graph("constant_add")
    x = g.rand_input("x", [3, 4])
    value = numpy_helper.from_array((g.weights_rng.standard_normal([3, 4]) * 0.5).astype(np.float32))
    c = g.node("Constant", [], value=value)
    g.output(g.node("Add", [x, c]))
    return g


def layernorm(g, x, width):
    return g.node("LayerNormalization", [x, g.weight(g.fresh("gamma"), [width]),
                                         g.weight(g.fresh("beta"), [width])], axis=-1, epsilon=1e-5)


def mlp(case, batch, dynamic=False):
    g = Graph(case, "mlp_dynamic" if dynamic else None)
    dims = ["N", 12] if dynamic else None
    x = g.rand_input("x", [batch, 12], dims=dims)
    h = g.node("Gemm", [x, g.weight("w1", [32, 12]), g.weight("b1", [32])], transB=1)
    h = g.node("Relu", [h])
    h = g.node("Gemm", [h, g.weight("w2", [32, 5]), g.weight("b2", [5])])
    g.output(g.node("Softmax", [h], axis=-1), ["N", 5] if dynamic else None)
    return g


def cnn(case, batch, dynamic=False):
    g = Graph(case, "cnn_dynamic" if dynamic else None)
    dims = ["N", 1, 8, 8] if dynamic else None
    x = g.rand_input("x", [batch, 1, 8, 8], dims=dims)
    h = g.node("Conv", [x, g.weight("w", [4, 1, 3, 3]), g.weight("b", [4])],
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = g.node("Relu", [h])
    h = g.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = g.node("Flatten", [h], axis=1)
    h = g.node("Gemm", [h, g.weight("fc_w", [10, 64]), g.weight("fc_b", [10])], transB=1)
    g.output(h, ["N", 10] if dynamic else None)
    return g


def attention():
    """A transformer encoder block: 2 heads of 8 over [2, 6, 16], post-norm."""
    g = Graph("attention_block")
    x = g.rand_input("x", [2, 6, 16])

    def linear(v, name, n_in, n_out):
        return g.node("Add", [g.node("MatMul", [v, g.weight(f"{name}_w", [n_in, n_out])]),
                              g.weight(f"{name}_b", [n_out])])

    heads_shape = g.i64("heads_shape", [2, 6, 2, 8])
    q, k, v = (g.node("Transpose", [g.node("Reshape", [linear(x, n, 16, 16), heads_shape])],
                      perm=[0, 2, 1, 3]) for n in ("q", "k", "v"))
    scores = g.node("MatMul", [q, g.node("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = g.node("Div", [scores, g.const("sqrt_head_dim", np.array(math.sqrt(8), np.float32))])
    attn = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])
    attn = g.node("Reshape", [g.node("Transpose", [attn], perm=[0, 2, 1, 3]),
                              g.i64("model_shape", [2, 6, 16])])
    h = layernorm(g, g.node("Add", [linear(attn, "o", 16, 16), x]), 16)
    ffn = linear(g.node("Gelu", [linear(h, "ffn1", 16, 32)], approximate="none"), "ffn2", 32, 16)
    g.output(layernorm(g, g.node("Add", [ffn, h]), 16))
    return g


def const_fold():
    """A weight computed from initializers only (Transpose, Mul) before the MatMul."""
    g = Graph("const_fold_matmul")
    x = g.rand_input("x", [3, 6])
    w = g.node("Transpose", [g.weight("w_t", [8, 6])], perm=[1, 0])
    w = g.node("Mul", [w, g.const("scale", np.array(0.25, np.float32))])
    g.output(g.node("MatMul", [x, w]))
    return g


def cases():
    yield from (binary(op, v) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min") for v in BINARY_SHAPES)
    yield from (unary(op) for op in ("Relu", "Exp", "Tanh", "Sigmoid", "Erf", "Neg", "Identity"))
    yield unary("Gelu", approximate="none")
    yield unary("Dropout", "dropout_inference")
    yield matmul("matmul_2d", [5, 7], [7, 3])
    yield matmul("matmul_3d_weight_2d", [2, 5, 7], [7, 3], b_weight=True)
    yield matmul("matmul_batched_3d", [2, 5, 7], [2, 7, 3])
    yield matmul("matmul_batched_4d", [2, 3, 4, 5], [2, 3, 5, 6])
    yield gemm("gemm_bias_vec", [4, 6], [6, 3], [3])
    yield gemm("gemm_transb", [4, 6], [3, 6], [3], transB=1)
    yield gemm("gemm_transa", [6, 4], [6, 3], [3], transA=1)
    yield gemm("gemm_alpha_beta_c2d", [4, 6], [6, 3], [4, 3], alpha=0.5, beta=2.0)
    yield gemm("gemm_no_c", [4, 6], [6, 3])
    yield conv("conv_3x3_s1_p1", [2, 3, 9, 9], [4, 3, 3, 3], pads=[1, 1, 1, 1])
    yield conv("conv_5x5_s2_p2_nobias", [2, 3, 9, 9], [4, 3, 5, 5], bias=False,
               strides=[2, 2], pads=[2, 2, 2, 2])
    yield conv("conv_1x1", [2, 3, 9, 9], [5, 3, 1, 1])
    yield conv("conv_3x3_s2_p0_rect", [2, 3, 11, 8], [4, 3, 3, 3], strides=[2, 2])
    yield single("MaxPool", "maxpool_2x2_s2", [2, 3, 8, 8], kernel_shape=[2, 2], strides=[2, 2])
    yield single("MaxPool", "maxpool_3x3_s2_p1", [2, 3, 9, 9], kernel_shape=[3, 3], strides=[2, 2],
                 pads=[1, 1, 1, 1])
    yield single("AveragePool", "avgpool_2x2_s2", [2, 3, 8, 8], kernel_shape=[2, 2], strides=[2, 2])
    yield single("AveragePool", "avgpool_3x3_s1_p1_exclude_pad", [2, 3, 7, 7], kernel_shape=[3, 3],
                 pads=[1, 1, 1, 1], count_include_pad=0)
    yield single("GlobalAveragePool", "global_avgpool", [2, 3, 7, 5])
    yield single("Softmax", "softmax_last", [3, 10], axis=-1)
    yield single("Softmax", "softmax_axis1", [2, 5, 4], axis=1)
    yield single("LayerNormalization", "layernorm_scale_bias", [4, 16], axis=-1, epsilon=1e-5,
                 extra=[lambda g: g.weight("scale", [16]), lambda g: g.weight("bias", [16])])
    yield single("LayerNormalization", "layernorm_no_bias", [2, 3, 8], axis=-1, epsilon=1e-5,
                 extra=[lambda g: g.weight("scale", [8])])
    yield single("Transpose", "transpose_2d", [3, 5], perm=[1, 0])
    yield single("Transpose", "transpose_3d_021", [2, 3, 4], perm=[0, 2, 1])
    yield single("Transpose", "transpose_4d_0213", [2, 3, 4, 5], perm=[0, 2, 1, 3])
    yield single("Transpose", "transpose_4d_3210", [2, 3, 4, 5], perm=[3, 2, 1, 0])
    yield single("Reshape", "reshape_zero_minus1", [2, 3, 4],
                 extra=[lambda g: g.i64("shape", [0, -1, 2])])
    yield single("Flatten", "flatten_axis1", [2, 3, 4], axis=1)
    yield single("Squeeze", "squeeze_axes", [2, 1, 4, 1], extra=[lambda g: g.i64("axes", [1, 3])])
    yield single("Unsqueeze", "unsqueeze_axes", [2, 4], extra=[lambda g: g.i64("axes", [0, -1])])
    yield concat("concat2_axis0", [[2, 3], [4, 3]], 0)
    yield concat("concat3_axis1", [[2, 1, 4], [2, 3, 4], [2, 2, 4]], 1)
    yield concat("concat4_axis_last", [[2, 3, 1], [2, 3, 2], [2, 3, 3], [2, 3, 4]], -1)
    yield gather_const_indices()
    yield gather_embedding()
    yield from (reduce(op, k) for op in ("ReduceSum", "ReduceMean") for k in (1, 0))
    yield constant_add()
    yield mlp("mlp", 4)
    yield cnn("cnn", 2)
    yield attention()
    yield const_fold()
    for batch in (1, 3):
        yield mlp(f"mlp_dynamic@{batch}", batch, dynamic=True)
        yield cnn(f"cnn_dynamic@{batch}", batch, dynamic=True)


# --- bad models -------------------------------------------------------------------

def bad_model(nodes, inputs, outputs, initializers=(), domains=()):
    graph = helper.make_graph(nodes, "bad", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=opsets, producer_name="tensor-wasm scripts/onnx/graphs.py")


def vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def f32(name, dims):
    return vi(name, TensorProto.FLOAT, dims)


def bad_cases():
    """(file, expect, why, model bytes, what ONNX itself says of it)."""
    rng = seeded("bad")
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    w = numpy_helper.from_array((rng.standard_normal([3, 4]) * 0.5).astype(np.float32), "w")
    einsum = bad_model([helper.make_node("Einsum", ["x", "w"], ["y"], equation="ij,jk->ik")],
                       [f32("x", [2, 3])], [f32("y", [2, 4])], [w])
    yield ("unsupported_op_einsum.onnx", "onnx_unsupported",
           "Einsum is a valid ONNX operator the executor does not implement; the error names Einsum",
           einsum, "valid")
    i64 = TensorProto.INT64
    yield ("add_int64.onnx", "onnx_unsupported",
           "Add over int64 tensors: the executor computes in f32 only; the error names int64",
           bad_model([helper.make_node("Add", ["a", "b"], ["y"])],
                     [vi("a", i64, [2, 3]), vi("b", i64, [2, 3])], [vi("y", i64, [2, 3])]), "valid")
    f64 = TensorProto.DOUBLE
    yield ("input_float64.onnx", "onnx_unsupported",
           "a float64 graph input (Relu over double): the error names float64 (double)",
           bad_model(relu, [vi("x", f64, [2, 3])], [vi("y", f64, [2, 3])]), "valid")
    group2 = bad_model([helper.make_node("Conv", ["x", "w"], ["y"], group=2, kernel_shape=[3, 3])],
                       [f32("x", [1, 4, 5, 5])], [f32("y", [1, 4, 3, 3])],
                       [numpy_helper.from_array((rng.standard_normal([4, 2, 3, 3]) * 0.5).astype(np.float32), "w")])
    yield ("conv_group2.onnx", "onnx_unsupported",
           "Conv with group=2: valid ONNX, an attribute value the executor does not support; the error names group",
           group2, "valid")
    yield ("custom_domain.onnx", "onnx_unsupported",
           "a node in domain com.microsoft (Gelu): only the default domain is supported; the error names the domain",
           bad_model([helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")],
                     [f32("x", [2, 3])], [f32("y", [2, 3])], domains=["com.microsoft"]), "valid")
    cycle = bad_model([helper.make_node("Add", ["x", "b"], ["a"], name="first"),
                       helper.make_node("Add", ["a", "x"], ["b"], name="second")],
                      [f32("x", [2, 3])], [f32("b", [2, 3])])
    yield ("cycle.onnx", "onnx_invalid_graph",
           "two Add nodes each consuming the other's output: the graph has a cycle", cycle, "invalid")
    yield ("undefined_value.onnx", "onnx_invalid_graph",
           "a node reads `ghost`, which no input, initializer or node defines",
           bad_model([helper.make_node("Add", ["x", "ghost"], ["y"])], [f32("x", [2, 3])], [f32("y", [2, 3])]),
           "invalid")
    yield ("output_not_produced.onnx", "onnx_invalid_graph",
           "graph output `z` is produced by no node (nor is it an input or initializer)",
           bad_model(relu, [f32("x", [2, 3])], [f32("y", [2, 3]), f32("z", [2, 3])]), "invalid")
    whole = conv("conv_truncated_source", [1, 3, 9, 9], [8, 3, 5, 5], pads=[2, 2, 2, 2]).model()
    whole = whole.SerializeToString()
    yield ("truncated.onnx", "onnx_malformed",
           f"the first {len(whole) // 2} of the {len(whole)} bytes of a valid Conv model: protobuf decoding fails",
           whole[: len(whole) // 2], "malformed")
    yield ("random_bytes.onnx", "onnx_malformed", "4096 random bytes (fixed seed): not a protobuf ModelProto",
           rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(), "malformed")


def onnx_verdict(data):
    """What onnx's full check and ONNX Runtime say of a model: valid, invalid or malformed."""
    try:
        model = onnx.load_model_from_string(data)
    except Exception:
        return "malformed"
    verdicts = set()
    for check in (lambda: onnx.checker.check_model(model, full_check=True), lambda: session(data)):
        try:
            check()
            verdicts.add("valid")
        except Exception:
            verdicts.add("invalid")
    return verdicts.pop() if len(verdicts) == 1 else "valid for one of onnx and ONNX Runtime only"


def write_bad(out_dir):
    bad_dir = out_dir / "bad"
    bad_dir.mkdir(parents=True, exist_ok=True)
    index = []
    for file, expect, why, model, verdict in bad_cases():
        data = model if isinstance(model, bytes) else model.SerializeToString()
        got = onnx_verdict(data)
        assert got == verdict, f"bad/{file}: onnx and ONNX Runtime find it {got}, not {verdict}"
        (bad_dir / file).write_bytes(data)
        index.append({"file": file, "expect": expect, "why": why})
    (bad_dir / "index.json").write_text(json_lines(index))
    return index


# --- check what was written ---------------------------------------------------------

def read_array(path, entry):
    dtype = {"float32": "<f4", "int64": "<i8"}[entry["dtype"]]
    data = np.fromfile(path / entry["file"], dtype=dtype)
    assert data.size == math.prod(entry["dims"]), f"{path / entry['file']}: {data.size} elements"
    return data.reshape(entry["dims"])


def rerun_case(case_dir):
    """Reloads one case from disk and reruns it: ONNX Runtime gives the same bytes."""
    case = json.loads((case_dir / "case.json").read_text())
    onnx.checker.check_model(onnx.load(case_dir / "model.onnx"), full_check=True)
    feeds = {t["name"]: read_array(case_dir, t) for t in case["inputs"]}
    got = session(str(case_dir / "model.onnx")).run([t["name"] for t in case["outputs"]], feeds)
    for t, value in zip(case["outputs"], got):
        want = read_array(case_dir, t)
        assert value.shape == want.shape and value.tobytes() == want.tobytes(), \
            f"{case['name']}: output {t['name']} differs when rerun from disk"


def check_written(out_dir, index):
    """Reloads every case from disk and reruns it: ONNX Runtime gives the same bytes."""
    for entry in json.loads((out_dir / "index.json").read_text()):
        rerun_case(out_dir / entry["name"])
    assert [e["name"] for e in json.loads((out_dir / "index.json").read_text())] == [e["name"] for e in index]


def write_slow(out_dir):
    """slow/model.onnx: x [512, 512] through 1024 MatMuls by one 512 x 512 weight (275 GFLOP,
    no reference output): long enough that a short deadline ends it during compute."""
    w = (seeded("slow").standard_normal((512, 512)) * 0.01).astype(np.float32)
    nodes, last = [], "x"
    for i in range(1024):
        nodes.append(helper.make_node("MatMul", [last, "w"], [f"h{i}"]))
        last = f"h{i}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "slow", [f32("x", [512, 512])], [f32("y", [512, 512])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="tensor-wasm scripts/onnx/graphs.py")
    onnx.checker.check_model(model, full_check=True)
    (out_dir / "slow").mkdir(exist_ok=True)
    (out_dir / "slow" / "model.onnx").write_bytes(model.SerializeToString())


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: graphs.py OUT_DIR")
    out_dir = Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    index = [write_case(out_dir, g) for g in cases()]
    names = [e["name"] for e in index]
    assert len(set(names)) == len(names), "two cases share a name"
    (out_dir / "index.json").write_text(json_lines(index))
    bad = write_bad(out_dir)
    write_slow(out_dir)
    check_written(out_dir, index)
    paths = [out_dir / "index.json", out_dir / "bad" / "index.json"]
    paths += [p for n in names for p in (out_dir / n).iterdir()]
    paths += [out_dir / "bad" / b["file"] for b in bad]
    total = sum(p.stat().st_size for p in paths)
    print(f"graphs.py: {len(index)} cases, {len(bad)} bad models, {total} bytes in {out_dir} "
          f"(onnx {onnx.__version__}, onnxruntime {ort.__version__}, opset {OPSET})")


if __name__ == "__main__":
    main(sys.argv)
