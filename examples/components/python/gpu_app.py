"""A TensorWasm function in Python that uses the GPU through the `tensor-wasm:gpu` WIT interface
(../gpu-demo.wit): kernels run on buffers the host owns, chained on the device, and every result
is checked against the same arithmetic in plain Python. On a host without CUDA the kernels run on
the CPU backend, with results identical to the GPU's.
"""

import struct

import wit_world
from componentize_py_types import Err
from wit_world.imports import kernels
from wit_world.imports.buffers import Buffer
from wit_world.imports.kernels import Arg_Buffer, Arg_F32, Arg_U32, Dim3, Kernel


def f32s(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def floats(data: bytes) -> list:
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def round_f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def linear(n: int, block: int = 256):
    return Dim3((n + block - 1) // block, 1, 1), Dim3(block, 1, 1)


def gpu_error(e: Err) -> str:
    return f"{type(e.value).__name__}: {e.value.value}"


class WitWorld(wit_world.WitWorld):
    def add_then_scale(self, n: int, factor: float) -> wit_world.Chained:
        a = [i * 0.5 for i in range(n)]
        b = [(n - i) * 0.25 for i in range(n)]
        try:
            with Buffer.allocate(4 * n) as da, Buffer.allocate(4 * n) as db, \
                    Buffer.allocate(4 * n) as dsum, Buffer.allocate(4 * n) as dout:
                da.write(0, f32s(a))
                db.write(0, f32s(b))
                grid, block = linear(n)
                with Kernel.from_blueprint("vector_add") as add:
                    kernels.launch(add, grid, block, 0,
                                   [Arg_Buffer(da), Arg_Buffer(db), Arg_Buffer(dsum), Arg_U32(n)])
                # The sum stays on the device: `scale` reads it where `vector_add` wrote it.
                with Kernel.from_blueprint("scale") as scale:
                    kernels.launch(scale, grid, block, 0,
                                   [Arg_Buffer(dsum), Arg_Buffer(dout), Arg_F32(factor), Arg_U32(n)])
                out = floats(dout.read(0, 4 * n))
        except Err as e:
            raise Err(gpu_error(e))
        want = [round_f32(round_f32(round_f32(x) + round_f32(y)) * round_f32(factor))
                for x, y in zip(a, b)]
        mismatches = sum(1 for got, w in zip(out, want) if got != w)
        return wit_world.Chained(first=out[:4], mismatches=mismatches)

    def matmul_check(self, m: int, k: int, n: int) -> float:
        a = [float((i * 7) % 13) - 6.0 for i in range(m * k)]
        b = [float((i * 5) % 11) * 0.5 for i in range(k * n)]
        try:
            with Buffer.allocate(4 * m * k) as da, Buffer.allocate(4 * k * n) as db, \
                    Buffer.allocate(4 * m * n) as dc, Kernel.from_blueprint("matmul") as mm:
                da.write(0, f32s(a))
                db.write(0, f32s(b))
                kernels.launch(mm, Dim3((n + 15) // 16, (m + 15) // 16, 1), Dim3(16, 16, 1), 0,
                               [Arg_Buffer(da), Arg_Buffer(db), Arg_Buffer(dc),
                                Arg_U32(m), Arg_U32(n), Arg_U32(k)])
                c = floats(dc.read(0, 4 * m * n))
        except Err as e:
            raise Err(gpu_error(e))
        worst = 0.0
        for row in range(m):
            for col in range(n):
                want = sum(a[row * k + i] * b[i * n + col] for i in range(k))
                worst = max(worst, abs(c[row * n + col] - want))
        return worst

    def misuse(self, what: str) -> str:
        try:
            if what == "oversized":
                Buffer.allocate(1 << 40)
            elif what == "out-of-range":
                with Buffer.allocate(16) as b:
                    b.write(12, b"12345678")
            elif what == "unknown-blueprint":
                Kernel.from_blueprint("no_such_kernel")
            elif what == "raw-ptx":
                Kernel.from_ptx(".version 7.0", "k")
            elif what == "bad-args":
                with Buffer.allocate(16) as b, Kernel.from_blueprint("vector_add") as k:
                    kernels.launch(k, Dim3(1, 1, 1), Dim3(1, 1, 1), 0, [Arg_Buffer(b), Arg_U32(4)])
            elif what == "hog":
                held = [Buffer.allocate(1 << 20) for _ in range(1 << 12)]
                return f"held {len(held)} buffers"
            else:
                raise Err(f"unknown misuse {what!r}")
        except Err as e:
            if isinstance(e.value, str):
                raise
            return gpu_error(e)
        raise Err(f"{what}: the host accepted it")
