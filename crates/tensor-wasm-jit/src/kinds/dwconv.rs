//! `dwconv2d[RxS,sT,pP]`: depthwise 2-D convolution (ONNX `Conv` with `group` = channels),
//! one `R × S` filter per channel, with `conv2d`'s window grammar, limits and output size
//! ([`conv2d_output_size`]). f32 and i32.
//!
//! Parameters: `input` (`n × c × h × w`), `weight` (`c × R × S`, ONNX's `c × 1 × R × S`),
//! `output` (`n × c × P × Q`), then `n, c, h, w`. Output `[img][ch][p][q]` is
//! `((+0 + x_0·w_0) + x_1·w_1) + ...` over the taps of its window inside the input, in order of
//! filter rows `r`, then columns `s`, every product and sum rounded on its own (f32 `mul.rn`,
//! `add.rn`, never an FMA; i32 wrapping): `conv2d`'s accumulation restricted to one channel, so
//! each channel gives the bits of a `conv2d` with `c = k = 1`. Taps in the padding are skipped.
//!
//! Grid as `conv2d`'s: `[ceil(P·Q / 256), c, n]`, thread `i` of block `(bx, ch, img)` computes
//! pixel `bx · 256 + i` (row-major over `P × Q`) of channel `ch` of image `img`. The CPU runs it
//! as rows (output row `p` of a plane per row, [`RowRun`]), vectorised across the row.

use std::borrow::Cow;
use std::fmt;

use tensor_wasm_gpu::gemm::decode_into;
use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use zerocopy::FromBytes;

use super::conv2d::{check_window, conv2d_output_size, parse_window, Conv2dParams};
use super::rows::{load, with_values, RowOp, RowRun};
use super::{blocks, product, Kind};
use crate::contract::{Param, ParamKind, Shape, BLOCK_1D};
use crate::cpu::{covered, Element, Stage};
use crate::emit::{global_index_1d, global_pointer, ins, label, Ops};
use crate::{Dtype, JitError};

/// `dwconv2d[RxS,sT,pP]`: one filter per channel (a depthwise convolution).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DepthwiseConv2d(pub Conv2dParams);

/// `n, c, h, w` of a shape with four sizes.
fn dims(shape: &Shape) -> Option<[u32; 4]> {
    match shape {
        Shape::Sizes { .. } => shape.sizes().try_into().ok(),
        _ => None,
    }
}

impl Kind for DepthwiseConv2d {
    const NAME: &'static str = "dwconv2d";
    const EXAMPLES: &'static [&'static str] = &[
        "dwconv2d[3x3,s1,p1]",
        "dwconv2d[3x3,s2,p1]",
        "dwconv2d[5x5,s1,p2]",
        "dwconv2d[5x5,s2,p2]",
        "dwconv2d[1x1]",
        "dwconv2d[3x5,s3]",
        "dwconv2d[7x7,s8,p3]",
    ];

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        parse_window(descriptor, params, Self::NAME).map(DepthwiseConv2d)
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.write_params(f)
    }

    fn check(&self, _dtype: Dtype) -> Result<(), String> {
        check_window(&self.0, Self::NAME)
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        vec![
            Param::new("input", ParamKind::Input),
            Param::new("weight", ParamKind::Input),
            Param::new("output", ParamKind::Output),
            Param::new("n", ParamKind::U32),
            Param::new("c", ParamKind::U32),
            Param::new("h", ParamKind::U32),
            Param::new("w", ParamKind::U32),
        ]
    }

    fn grid_axes(&self) -> usize {
        3
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let [n, c, h, w] = dims(shape)?;
        let (p, q) = conv2d_output_size(&self.0, h, w);
        Some([
            blocks(p.saturating_mul(q), u64::from(BLOCK_1D)),
            u64::from(c).max(1),
            u64::from(n).max(1),
        ])
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        (sizes.len() == 4).then(|| Shape::of_sizes(sizes))
    }

    fn buffer_elements(&self, shape: &Shape, _buffers: usize) -> Vec<Option<u64>> {
        let Some([n, c, h, w]) = dims(shape) else {
            return Vec::new();
        };
        let (p, q) = conv2d_output_size(&self.0, h, w);
        let output = product(&[n, c]).and_then(|nc| nc.checked_mul(p)?.checked_mul(q));
        vec![
            product(&[n, c, h, w]),
            product(&[c, self.0.r, self.0.s]),
            output,
        ]
    }

    fn emit(&self, _dtype: Dtype, _params: &[Param], ops: &Ops, out: &mut String) {
        dwconv2d(out, ops, self.0);
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let (Some(sizes), &[input, weight, output]) = (dims(shape), buffers) else {
            return Err(JitError::InvalidLaunch(format!("dwconv2d: {args:?}")));
        };
        let window = self.0;
        let (p, q) = conv2d_output_size(&window, sizes[2], sizes[3]);
        let [n, c, h, w] = sizes.map(|size| size as usize);
        // Validation checked every buffer against the memory, so a shape with output elements
        // fits in usize; one without has nothing to compute.
        let (p, q) = if p == 0 || q == 0 {
            (0, 0)
        } else {
            (p as usize, q as usize)
        };
        let images = n.min(config.grid[2] as usize);
        let op = Depthwise {
            r: window.r as usize,
            s: window.s as usize,
            stride: window.stride as usize,
            pad: window.pad as usize,
            c,
            h,
            w,
            p,
            q,
            channels: c.min(config.grid[1] as usize),
            pixels: covered(config, 1, (p * q) as u64),
        };
        let taps = op.r * op.s;
        let inputs = vec![
            input..input + 4 * n * c * h * w,
            weight..weight + 4 * c * taps,
        ];
        // Every row of the covered images; rows of channels or pixels the grid leaves out keep
        // their bytes (`keeps_output`).
        Ok(Box::new(RowRun::<T, _>::covering(
            op,
            inputs,
            output,
            images * c * p,
            q,
            q,
        )))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        // Planes of more than a block's pixels (a second block along x) at times.
        let w = if (250..260).contains(&dims[3]) {
            40 + dims[3] % 8
        } else {
            dims[3] % 12
        };
        Shape::of_sizes(&[dims[0] % 3, dims[1] % 4, dims[2] % 12, w])
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        [
            Shape::of_sizes(&[2, 3, 17, 13]),
            Shape::of_sizes(&[4, 32, 56, 57]),
        ]
    }
}

/// One output pixel per thread (`conv2d`'s code without the loop over input channels): the
/// taps in order of `r` then `s`, those outside the input skipped.
fn dwconv2d(out: &mut String, ops: &Ops, window: Conv2dParams) {
    let Conv2dParams { r, s, stride, pad } = window;
    global_index_1d(out);
    ins!(out, "mov.u32 %r3, %ctaid.y;");
    ins!(out, "cvt.u64.u32 %rd2, %r3; // channel");
    ins!(out, "mov.u32 %r4, %ctaid.z;");
    ins!(out, "cvt.u64.u32 %rd3, %r4; // image");
    for (reg, name) in [(4, "n"), (5, "c"), (6, "h"), (7, "w")] {
        ins!(out, "ld.param.u32 %r5, [p_{name}];");
        ins!(out, "cvt.u64.u32 %rd{reg}, %r5;");
    }
    ins!(out, "setp.ge.u64 %p1, %rd3, %rd4; // guard: image < n");
    ins!(out, "@%p1 bra DONE;");
    ins!(out, "setp.ge.u64 %p1, %rd2, %rd5; // guard: channel < c");
    ins!(out, "@%p1 bra DONE;");
    // P = (h + 2 pad - r) / stride + 1, Q likewise; none when the padded input is too small.
    for (reg, input, filter) in [(9, 6, r), (10, 7, s)] {
        ins!(out, "add.u64 %rd{reg}, %rd{input}, {};", 2 * pad);
        ins!(out, "setp.lt.u64 %p1, %rd{reg}, {filter};");
        ins!(out, "@%p1 bra DONE;");
        ins!(out, "sub.u64 %rd{reg}, %rd{reg}, {filter};");
        ins!(out, "div.u64 %rd{reg}, %rd{reg}, {stride};");
        ins!(out, "add.u64 %rd{reg}, %rd{reg}, 1;");
    }
    ins!(out, "mul.lo.u64 %rd11, %rd9, %rd10;");
    ins!(out, "setp.ge.u64 %p1, %rd1, %rd11; // guard: pixel < P * Q");
    ins!(out, "@%p1 bra DONE;");
    ins!(out, "div.u64 %rd12, %rd1, %rd10; // p");
    ins!(out, "mul.lo.u64 %rd13, %rd12, %rd10;");
    ins!(out, "sub.u64 %rd13, %rd1, %rd13; // q");
    ins!(
        out,
        "mad.lo.u64 %rd8, %rd3, %rd5, %rd2; // plane: img * c + channel"
    );
    global_pointer(out, 14, "input");
    global_pointer(out, 15, "weight");
    ins!(out, "mul.lo.u64 %rd16, %rd8, %rd6;");
    ins!(out, "mul.lo.u64 %rd16, %rd16, %rd7;");
    ins!(out, "shl.b64 %rd16, %rd16, 2;");
    ins!(
        out,
        "add.u64 %rd14, %rd14, %rd16; // &input[img][channel][0][0]"
    );
    ins!(out, "mul.lo.u64 %rd16, %rd2, {};", r * s * 4);
    ins!(
        out,
        "add.u64 %rd15, %rd15, %rd16; // &weight[channel][0][0]"
    );
    ins!(out, "mul.lo.u64 %rd18, %rd12, {stride}; // p * stride");
    ins!(out, "mul.lo.u64 %rd19, %rd13, {stride}; // q * stride");
    ins!(out, "mov.b32 %v0, 0;");
    ins!(out, "mov.u32 %r6, 0; // r");
    label!(out, "FILTER_ROW");
    ins!(out, "setp.ge.u32 %p3, %r6, {r};");
    ins!(out, "@%p3 bra FILTER_ROW_END;");
    ins!(out, "cvt.u64.u32 %rd21, %r6;");
    ins!(out, "add.u64 %rd21, %rd21, %rd18;");
    ins!(out, "setp.lt.u64 %p4, %rd21, {pad}; // guard: ih >= 0");
    ins!(out, "@%p4 bra FILTER_ROW_NEXT;");
    ins!(out, "sub.u64 %rd21, %rd21, {pad}; // ih");
    ins!(out, "setp.ge.u64 %p4, %rd21, %rd6; // guard: ih < h");
    ins!(out, "@%p4 bra FILTER_ROW_NEXT;");
    ins!(out, "mul.lo.u64 %rd22, %rd21, %rd7;");
    ins!(out, "shl.b64 %rd22, %rd22, 2;");
    ins!(
        out,
        "add.u64 %rd22, %rd22, %rd14; // &input[img][channel][ih][0]"
    );
    ins!(out, "mul.wide.u32 %rd23, %r6, {};", s * 4);
    ins!(
        out,
        "add.u64 %rd23, %rd23, %rd15; // &weight[channel][r][0]"
    );
    ins!(out, "mov.u32 %r7, 0; // s");
    label!(out, "FILTER_COL");
    ins!(out, "setp.ge.u32 %p5, %r7, {s};");
    ins!(out, "@%p5 bra FILTER_ROW_NEXT;");
    ins!(out, "cvt.u64.u32 %rd24, %r7;");
    ins!(out, "add.u64 %rd24, %rd24, %rd19;");
    ins!(out, "setp.lt.u64 %p6, %rd24, {pad}; // guard: iw >= 0");
    ins!(out, "@%p6 bra FILTER_COL_NEXT;");
    ins!(out, "sub.u64 %rd24, %rd24, {pad}; // iw");
    ins!(out, "setp.ge.u64 %p6, %rd24, %rd7; // guard: iw < w");
    ins!(out, "@%p6 bra FILTER_COL_NEXT;");
    ins!(out, "shl.b64 %rd24, %rd24, 2;");
    ins!(out, "add.u64 %rd24, %rd24, %rd22;");
    ins!(out, "ld.global.b32 %v1, [%rd24];");
    ins!(out, "mul.wide.u32 %rd25, %r7, 4;");
    ins!(out, "add.u64 %rd25, %rd25, %rd23;");
    ins!(out, "ld.global.b32 %v2, [%rd25];");
    ins!(out, "{} %v3, %v1, %v2;", ops.mul);
    ins!(out, "{} %v0, %v0, %v3;", ops.add);
    label!(out, "FILTER_COL_NEXT");
    ins!(out, "add.u32 %r7, %r7, 1;");
    ins!(out, "bra FILTER_COL;");
    label!(out, "FILTER_ROW_NEXT");
    ins!(out, "add.u32 %r6, %r6, 1;");
    ins!(out, "bra FILTER_ROW;");
    label!(out, "FILTER_ROW_END");
    // out[(plane * P + p) * Q + q]
    global_pointer(out, 26, "output");
    ins!(out, "mad.lo.u64 %rd27, %rd8, %rd9, %rd12;");
    ins!(out, "mad.lo.u64 %rd27, %rd27, %rd10, %rd13;");
    ins!(out, "shl.b64 %rd27, %rd27, 2;");
    ins!(out, "add.u64 %rd27, %rd27, %rd26;");
    ins!(out, "st.global.b32 [%rd27], %v0;");
}

/// The CPU rows of a launch: row `i` is output row `i % P` of plane `i / P` (plane = image ·
/// c + channel).
#[derive(Debug)]
struct Depthwise {
    r: usize,
    s: usize,
    stride: usize,
    pad: usize,
    c: usize,
    h: usize,
    w: usize,
    /// Output rows and columns of a plane.
    p: usize,
    q: usize,
    /// Channels of each image and pixels of each plane (row-major over `P × Q`) the launch's
    /// grid covers; the other outputs are left as they are.
    channels: usize,
    pixels: usize,
}

impl<T: Element> RowOp<T> for Depthwise {
    fn row_work(&self) -> usize {
        self.q * self.r * self.s
    }

    fn row(&self, row: usize, inputs: &[&[u8]], out: &mut [u8]) {
        with_values(out, |out: &mut [T]| self.compute(row, inputs, out));
    }

    fn keeps_output(&self) -> bool {
        self.channels < self.c || self.pixels < self.p * self.q
    }
}

impl Depthwise {
    /// The output columns `j` below `cols` whose tap `s` lies inside a row: `j · stride + s −
    /// pad` in `0..w`.
    fn columns(&self, s: usize, cols: usize) -> std::ops::Range<usize> {
        let first = self.pad.saturating_sub(s).div_ceil(self.stride);
        let end = (self.w + self.pad)
            .saturating_sub(s)
            .div_ceil(self.stride)
            .min(cols);
        first..end.max(first)
    }

    /// Row `row` of the output, its first `out.len()` elements (those the grid covers).
    fn compute<T: Element>(&self, row: usize, inputs: &[&[u8]], out: &mut [T]) {
        let (plane, p) = (row / self.p, row % self.p);
        let (&[x, weights], true) = (inputs, plane % self.c < self.channels) else {
            return;
        };
        let cols = out.len().min(self.pixels.saturating_sub(p * self.q));
        let out = &mut out[..cols];
        out.fill(T::ZERO);
        let x = &x[4 * plane * self.h * self.w..];
        let weights = &weights[4 * (plane % self.c) * self.r * self.s..];
        // Tap by tap over the whole row: each output still takes its taps in order of r, s.
        for r in 0..self.r {
            let Some(ih) = (p * self.stride + r).checked_sub(self.pad) else {
                continue;
            };
            if ih >= self.h {
                continue;
            }
            let line = values::<T>(&x[4 * ih * self.w..4 * (ih + 1) * self.w]);
            for s in 0..self.s {
                let tap: T = load(weights, r * self.s + s);
                let columns = self.columns(s, cols);
                if columns.is_empty() {
                    continue;
                }
                let first = columns.start * self.stride + s - self.pad;
                let outputs = out[columns].iter_mut();
                if self.stride == 1 {
                    for (value, &x) in outputs.zip(&line[first..]) {
                        *value = value.add(x.mul(tap));
                    }
                } else {
                    let taps = line[first..].iter().step_by(self.stride);
                    for (value, &x) in outputs.zip(taps) {
                        *value = value.add(x.mul(tap));
                    }
                }
            }
        }
    }
}

/// `bytes` as `T`s: borrowed when aligned (guest memory always is), else decoded.
fn values<T: Element>(bytes: &[u8]) -> Cow<'_, [T]> {
    match <[T]>::ref_from_bytes(bytes) {
        Ok(values) => Cow::Borrowed(values),
        Err(_) => {
            let mut values = vec![T::ZERO; bytes.len() / 4];
            decode_into(bytes, &mut values);
            Cow::Owned(values)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::Rng;
    use crate::{Blueprint, BlueprintKind};

    /// Runs `descriptor` on the CPU with `inputs` (bits) and an output of `out` elements
    /// (starting as a canary), `sizes` the launch's scalars; returns the output's bits.
    fn run(descriptor: &str, sizes: &[u32], inputs: &[&[u32]], out: usize) -> Vec<u32> {
        let blueprint = Blueprint::parse(descriptor).unwrap();
        let mut memory = Vec::new();
        let mut args = Vec::new();
        let canary = vec![0x5ac3_5ac3; out];
        for values in inputs.iter().copied().chain([canary.as_slice()]) {
            let offset = memory.len().next_multiple_of(64);
            memory.resize(offset, 0);
            memory.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            args.push(KernelArg::Buffer {
                offset: offset as u64,
                len: 4 * values.len() as u64,
            });
        }
        let at = memory.len() - 4 * out;
        args.extend(sizes.iter().copied().map(KernelArg::U32));
        let shape = blueprint.shape(sizes).unwrap();
        let config = blueprint.launch_config(&shape).unwrap();
        blueprint.run_cpu(&config, &args, &mut memory).unwrap();
        memory[at..]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    #[test]
    fn each_channel_gives_the_bits_of_a_one_channel_conv2d() {
        let windows = [
            "3x3,s1,p1",
            "3x3,s2,p1",
            "5x5,s1,p2",
            "5x5,s2,p2",
            "1x1,s1,p0",
            "3x5,s3,p0",
            "7x7,s2,p3",
            "2x4,s1,p1",
        ];
        let shapes = [[1, 1, 1, 1], [2, 3, 7, 9], [1, 4, 16, 33], [2, 2, 3, 1]];
        let mut rng = Rng::named("dwconv2d against conv2d");
        // Mostly ordinary values, so that most outputs are sums of many rounded products;
        // some edge values (NaN, infinities, signed zeros, any bits) and denormals.
        let mut draw = move || match rng.below(16) {
            0 => rng.f32_bits(),
            1 => rng.next_u64() as u32 & 0x807f_ffff,
            _ => (rng.next_u64() as u32 & 0x807f_ffff) | (120 + rng.below(15) as u32) << 23,
        };
        let (mut compared, mut nan) = (0, 0);
        for window in windows {
            let dw = Blueprint::parse(&format!("dwconv2d[{window}]")).unwrap();
            assert_eq!(dw.descriptor(), format!("dwconv2d[{window}]:f32"));
            let params: Vec<&str> = dw.params().iter().map(|p| p.name).collect();
            assert_eq!(params, ["input", "weight", "output", "n", "c", "h", "w"]);
            let BlueprintKind::DwConv2d(DepthwiseConv2d(params)) = *dw.kind() else {
                panic!("{dw} is not a dwconv2d");
            };
            for [n, c, h, w] in shapes {
                let (p, q) = conv2d_output_size(&params, h, w);
                let (p, q) = (p as usize, q as usize);
                let plane = (h * w) as usize;
                let taps = (params.r * params.s) as usize;
                let (images, channels) = (n as usize, c as usize);
                let x: Vec<u32> = (0..images * channels * plane).map(|_| draw()).collect();
                let weight: Vec<u32> = (0..channels * taps).map(|_| draw()).collect();
                let shape = Shape::of_sizes(&[n, c, h, w]);
                assert_eq!(
                    dw.launch_config(&shape).unwrap().grid,
                    [(p * q).div_ceil(256).max(1) as u32, c, n]
                );
                let out = images * channels * p * q;
                let got = run(&dw.descriptor(), &[n, c, h, w], &[&x, &weight], out);
                for (i, want_plane) in got.chunks((p * q).max(1)).enumerate() {
                    let ch = i % channels;
                    let want = run(
                        &format!("conv2d[{window}]"),
                        &[1, 1, h, w, 1],
                        &[
                            &x[i * plane..(i + 1) * plane],
                            &weight[ch * taps..(ch + 1) * taps],
                        ],
                        p * q,
                    );
                    // Bit for bit, except that any NaN equals any NaN (the CPU's NaN payloads are
                    // the hardware's, as everywhere in the backend).
                    for (j, (&got, &want)) in want_plane.iter().zip(&want).enumerate() {
                        let is_nan = |bits| f32::is_nan(f32::from_bits(bits));
                        assert!(
                            got == want || (is_nan(got) && is_nan(want)),
                            "dwconv2d[{window}] {:?}: image {} channel {ch} pixel {j}: \
                             {got:#010x}, conv2d {want:#010x}",
                            [n, c, h, w],
                            i / channels
                        );
                        nan += usize::from(is_nan(want));
                    }
                    compared += want.len();
                }
            }
        }
        // Enough outputs, mostly numbers, some NaNs.
        assert!(compared > 10_000, "{compared} outputs compared");
        assert!(
            nan > 0 && 4 * nan < compared,
            "{nan} of {compared} outputs are NaN"
        );
    }
}
