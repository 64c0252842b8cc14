#!/usr/bin/env python3
"""Derives the polynomial coefficients of tensor-wasm-jit's math module (src/math/*.rs).

Each polynomial is a near-minimax fit in float64: weighted least squares on 3000 Chebyshev
nodes, reweighted by Lawson's method towards the smallest maximum weighted error. The
coefficients are then rounded to f32 one at a time, lowest order first, the higher ones fitted
again after each rounding so that they absorb the rounding of the lower ones. Prints each set
as f32 bit patterns (what the Rust code holds) and the fit's maximum weighted error, measured in
float64 with the rounded coefficients; the error of the f32 evaluation is measured by the
Rust tests.

Needs numpy (the venv of scripts/install-deps.sh, .tools/cpu-peer/bin/python, has it):
    .tools/cpu-peer/bin/python scripts/math_coefficients.py
"""

import math
import struct

import numpy as np

NODES = 3000


def chebyshev_nodes(a, b, n=NODES):
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos((2 * k + 1) * np.pi / (2 * n))


def lawson(basis, target, weight, iterations=300):
    """Coefficients minimising (nearly) max |weight * (basis @ c - target)|."""
    u = np.ones(basis.shape[0]) / basis.shape[0]
    for _ in range(iterations):
        w = np.sqrt(u) * weight
        c, *_ = np.linalg.lstsq(basis * w[:, None], target * w, rcond=None)
        error = np.abs(weight * (basis @ c - target))
        u = u * error
        u /= u.sum()
    return c


def to_f32(value):
    return float(np.float32(value))


def bits(value):
    return struct.unpack("<I", struct.pack("<f", value))[0]


def fit_f32(basis, target, weight):
    """Near-minimax coefficients rounded to f32, lowest order first, refitting the rest."""
    fixed = []
    for k in range(basis.shape[1]):
        rest = target - basis[:, :k] @ np.array(fixed) if fixed else target
        fixed.append(to_f32(lawson(basis[:, k:], rest, weight)[0]))
    c = np.array(fixed)
    return c, np.max(np.abs(weight * (basis @ c - target)))


def report(name, about, coefficients, error):
    print(f"{name}: {about}")
    print("    max weighted error %.3e" % error)
    for c in coefficients:
        print("    f32::from_bits(0x%08x), // %.9e" % (bits(c), c))


erf = np.vectorize(math.erf)
erfc = np.vectorize(math.erfc)

# exp: e^r = 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3 + c6 r^4) for |r| <= ln2/2 (the
# interval widened by 0.1% for the rounding of the reduction); relative error.
half = math.log(2) / 2 * 1.001
r = chebyshev_nodes(-half, half)
basis = np.vander(r, 5, increasing=True) * (r * r)[:, None]
report("EXP_POLY", "c2..c6 of e^r", *fit_f32(basis, np.expm1(r) - r, 1 / np.exp(r)))

# erf, |x| < 7/8: erf(x) = x + x (c0 + c1 s + ... + c6 s^6), s = x^2; relative error.
x = chebyshev_nodes(0, 0.875)
s = x * x
basis = np.vander(s, 7, increasing=True) * x[:, None]
report("ERF_SMALL", "c0..c6 of erf(x)/x - 1 in s = x^2", *fit_f32(basis, erf(x) - x, 1 / erf(x)))

# erf, 7/8 <= |x| <= 4: erfc(x) = exp(-x^2) R(t), R(t) = c0 + c1 t + ... + c8 t^8,
# t = 1/(1 + x); relative error of R (= of erfc).
x = chebyshev_nodes(0.875, 4)
t = 1 / (1 + x)
scaled = erfc(x) * np.exp(x * x)
basis = np.vander(t, 9, increasing=True)
report("ERF_LARGE", "c0..c8 of erfc(x) exp(x^2) in t = 1/(1+x)", *fit_f32(basis, scaled, 1 / scaled))

# tanh, |x| < 5/8: tanh(x) = x + x^3 (c0 + c1 s + ... + c4 s^4), s = x^2; relative error.
x = chebyshev_nodes(0, 0.625)
s = x * x
basis = np.vander(s, 5, increasing=True) * (x**3)[:, None]
report("TANH_POLY", "c0..c4 of (tanh(x) - x)/x^3 in s = x^2", *fit_f32(basis, np.tanh(x) - x, 1 / np.tanh(x)))

for name, value in [
    ("LOG2E", 1 / math.log(2)),
    ("LN2_HI", math.log(2)),
    ("FRAC_1_SQRT_2", 1 / math.sqrt(2)),
]:
    print("%s: 0x%08x" % (name, bits(to_f32(value))))
ln2_hi = to_f32(math.log(2))
print("LN2_LO: 0x%08x (ln 2 - LN2_HI)" % bits(to_f32(math.log(2) - ln2_hi)))
