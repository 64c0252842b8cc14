//! `conv2d[RxS,sT,pP]`: direct 2-D convolution, NCHW input, KCRS weights, NKPQ output, one
//! output pixel per thread.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use tensor_wasm_gpu::gemm::{decode_into, encode_into, Gemm, GemmSource};
use tensor_wasm_gpu::{CpuPart, CpuParts, GpuError, KernelArg, LaunchConfig};

use super::conv_packed::Packed;
use super::rows::load;
use super::{blocks, parse_int, product, Kind, KindRun};
use crate::contract::{Param, ParamKind, Shape, BLOCK_1D};
use crate::cpu::{covered, write, Element, Stage, STEP_WORK};
use crate::cpu_parts::{disjoint, internal, split, GEMM_STEP};
use crate::emit::{global_index_1d, global_pointer, ins, label, Ops};
use crate::{Dtype, JitError};

/// Filter size, stride and zero padding of a direct 2-D convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    /// Filter height.
    pub r: u32,
    /// Filter width.
    pub s: u32,
    /// Step between output pixels, in input pixels (both axes).
    pub stride: u32,
    /// Zero padding on every side of the input (both axes).
    pub pad: u32,
}

/// Output height and width of a convolution over an `h` × `w` input:
/// `(h + 2·pad − r) / stride + 1`, or 0 when the padded input is smaller than the filter.
pub fn conv2d_output_size(params: &Conv2dParams, h: u32, w: u32) -> (u64, u64) {
    let side = |input: u32, filter: u32| {
        let padded = u64::from(input) + 2 * u64::from(params.pad);
        if padded < u64::from(filter) {
            0
        } else {
            (padded - u64::from(filter)) / u64::from(params.stride) + 1
        }
    };
    (side(h, params.r), side(w, params.s))
}

/// Parses a window `RxS[,sT][,pP]` (the brackets of `conv2d` and the pooling kinds); `kind`
/// names the kind in errors.
pub(crate) fn parse_window(
    descriptor: &str,
    params: &str,
    kind: &str,
) -> Result<Conv2dParams, JitError> {
    let mut parts = params.split(',');
    let filter = parts.next().unwrap_or_default();
    let Some((r, s)) = filter.split_once('x') else {
        return Err(JitError::parse(
            descriptor,
            format!("{kind} takes a filter RxS, e.g. {kind}[3x3,s1,p1]"),
        ));
    };
    let mut window = Conv2dParams {
        r: parse_int(descriptor, r)?,
        s: parse_int(descriptor, s)?,
        stride: 1,
        pad: 0,
    };
    let mut next = parts.next();
    if let Some(stride) = next.and_then(|part| part.strip_prefix('s')) {
        window.stride = parse_int(descriptor, stride)?;
        next = parts.next();
    }
    if let Some(pad) = next.and_then(|part| part.strip_prefix('p')) {
        window.pad = parse_int(descriptor, pad)?;
        next = parts.next();
    }
    if next.is_some() {
        return Err(JitError::parse(
            descriptor,
            format!("{kind} options are ,sSTRIDE then ,pPADDING"),
        ));
    }
    Ok(window)
}

/// The limits of a window (`conv2d` and the pooling kinds): `r`, `s` in 1..=11, stride in
/// 1..=8, padding below both `r` and `s`; `kind` names the kind in errors.
pub(crate) fn check_window(window: &Conv2dParams, kind: &str) -> Result<(), String> {
    for (what, value) in [("r", window.r), ("s", window.s)] {
        if !(1..=11).contains(&value) {
            return Err(format!(
                "{kind} filter {what} must be in 1..=11, not {value}"
            ));
        }
    }
    if !(1..=8).contains(&window.stride) {
        return Err(format!(
            "{kind} stride must be in 1..=8, not {}",
            window.stride
        ));
    }
    if window.pad >= window.r.min(window.s) {
        return Err(format!(
            "{kind} padding {} must be smaller than the filter ({}x{})",
            window.pad, window.r, window.s
        ));
    }
    Ok(())
}

/// The GPU suite's shapes: odd sizes, then more channels.
const SUITE_SHAPES: [Shape; 2] = [
    Shape::Conv2d {
        n: 2,
        c: 3,
        h: 17,
        w: 13,
        k: 4,
    },
    Shape::Conv2d {
        n: 1,
        c: 8,
        h: 40,
        w: 33,
        k: 6,
    },
];

impl Kind for Conv2dParams {
    const NAME: &'static str = "conv2d";
    const EXAMPLES: &'static [&'static str] = &[
        "conv2d[3x3]",
        "conv2d[3x3,p1]",
        "conv2d[3x3,s2,p1]",
        "conv2d[1x1]",
        "conv2d[5x3,p2]",
        "conv2d[2x2,s2]",
        "conv2d[5x7,s3,p4]",
        "conv2d[11x11,s8,p10]",
        "conv2d[1x1,s2]",
        "conv2d[7x7,s2,p3]",
    ];

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        parse_window(descriptor, params, Self::NAME)
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{},s{},p{}", self.r, self.s, self.stride, self.pad)
    }

    fn check(&self, _dtype: Dtype) -> Result<(), String> {
        check_window(self, Self::NAME)
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
            Param::new("k", ParamKind::U32),
        ]
    }

    fn grid_axes(&self) -> usize {
        3
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let Shape::Conv2d { n, h, w, k, .. } = *shape else {
            return None;
        };
        let (p, q) = conv2d_output_size(self, h, w);
        Some([
            blocks(p * q, u64::from(BLOCK_1D)),
            u64::from(k).max(1),
            u64::from(n).max(1),
        ])
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        match sizes {
            &[n, c, h, w, k] => Some(Shape::Conv2d { n, c, h, w, k }),
            _ => None,
        }
    }

    fn buffer_elements(&self, shape: &Shape, _buffers: usize) -> Vec<Option<u64>> {
        let Shape::Conv2d { n, c, h, w, k } = *shape else {
            return Vec::new();
        };
        let (p, q) = conv2d_output_size(self, h, w);
        let output = product(&[n, k]).and_then(|nk| nk.checked_mul(p)?.checked_mul(q));
        vec![
            product(&[n, c, h, w]),
            product(&[k, c, self.r, self.s]),
            output,
        ]
    }

    fn emit(&self, _dtype: Dtype, _params: &[Param], ops: &Ops, out: &mut String) {
        conv2d(out, ops, *self);
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        _args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let (Shape::Conv2d { n, c, h, w, k }, &[input, weight, output]) = (*shape, buffers) else {
            return Err(JitError::InvalidLaunch("conv2d takes three buffers".into()));
        };
        let (p, q) = conv2d_output_size(self, h, w);
        let conv = Conv {
            n: n as usize,
            c: c as usize,
            h: h as usize,
            w: w as usize,
            k: k as usize,
            r: self.r as usize,
            s: self.s as usize,
            stride: self.stride as usize,
            pad: self.pad as usize,
            p: p as usize,
            q: q as usize,
        };
        Ok(Box::new(ConvRun {
            pixels: covered(config, 1, p * q),
            channels: conv.k.min(config.grid[1] as usize),
            images: conv.n.min(config.grid[2] as usize),
            conv,
            buffers: [input, weight, output],
            at: [0, 0, 0],
            _element: std::marker::PhantomData,
        }))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        Shape::Conv2d {
            n: 1 + dims[0] % 2,
            c: 1 + dims[1] % 3,
            h: dims[2] % 10,
            w: dims[3] % 10,
            k: 1 + dims[4] % 3,
        }
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        SUITE_SHAPES
    }
}

/// Direct convolution, one output pixel per thread, accumulating over c, r, s in order and
/// skipping taps in the padding.
fn conv2d(out: &mut String, ops: &Ops, params: Conv2dParams) {
    let Conv2dParams { r, s, stride, pad } = params;
    global_index_1d(out);
    ins!(out, "mov.u32 %r3, %ctaid.y;");
    ins!(out, "cvt.u64.u32 %rd2, %r3; // output channel");
    ins!(out, "mov.u32 %r4, %ctaid.z;");
    ins!(out, "cvt.u64.u32 %rd3, %r4; // image");
    for (reg, name) in [(4, "n"), (5, "c"), (6, "h"), (7, "w"), (8, "k")] {
        ins!(out, "ld.param.u32 %r5, [p_{name}];");
        ins!(out, "cvt.u64.u32 %rd{reg}, %r5;");
    }
    ins!(out, "setp.ge.u64 %p1, %rd3, %rd4; // guard: image < n");
    ins!(out, "@%p1 bra DONE;");
    ins!(out, "setp.ge.u64 %p1, %rd2, %rd8; // guard: channel < k");
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
    global_pointer(out, 14, "input");
    global_pointer(out, 15, "weight");
    ins!(out, "mul.lo.u64 %rd16, %rd3, %rd5;");
    ins!(out, "mul.lo.u64 %rd16, %rd16, %rd6;");
    ins!(out, "mul.lo.u64 %rd16, %rd16, %rd7;");
    ins!(out, "shl.b64 %rd16, %rd16, 2;");
    ins!(out, "add.u64 %rd14, %rd14, %rd16; // &input[img][0][0][0]");
    ins!(out, "mul.lo.u64 %rd16, %rd2, %rd5;");
    ins!(out, "mul.lo.u64 %rd16, %rd16, {};", r * s * 4);
    ins!(out, "add.u64 %rd15, %rd15, %rd16; // &weight[ko][0][0][0]");
    ins!(out, "mul.lo.u64 %rd17, %rd6, %rd7;");
    ins!(out, "shl.b64 %rd17, %rd17, 2; // bytes per input plane");
    ins!(out, "mul.lo.u64 %rd18, %rd12, {stride}; // p * stride");
    ins!(out, "mul.lo.u64 %rd19, %rd13, {stride}; // q * stride");
    ins!(out, "mov.b32 %v0, 0;");
    ins!(out, "mov.u64 %rd20, 0; // ci");
    label!(out, "CHANNEL");
    ins!(out, "setp.ge.u64 %p2, %rd20, %rd5;");
    ins!(out, "@%p2 bra CHANNEL_END;");
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
        "add.u64 %rd22, %rd22, %rd14; // &input[img][ci][ih][0]"
    );
    ins!(out, "mul.wide.u32 %rd23, %r6, {};", s * 4);
    ins!(out, "add.u64 %rd23, %rd23, %rd15; // &weight[ko][ci][r][0]");
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
    ins!(out, "add.u64 %rd14, %rd14, %rd17;");
    ins!(out, "add.u64 %rd15, %rd15, {};", r * s * 4);
    ins!(out, "add.u64 %rd20, %rd20, 1;");
    ins!(out, "bra CHANNEL;");
    label!(out, "CHANNEL_END");
    // out[((img * k + ko) * P + p) * Q + q]
    global_pointer(out, 26, "output");
    ins!(out, "mad.lo.u64 %rd27, %rd3, %rd8, %rd2;");
    ins!(out, "mad.lo.u64 %rd27, %rd27, %rd9, %rd12;");
    ins!(out, "mad.lo.u64 %rd27, %rd27, %rd10, %rd13;");
    ins!(out, "shl.b64 %rd27, %rd27, 2;");
    ins!(out, "add.u64 %rd27, %rd27, %rd26;");
    ins!(out, "st.global.b32 [%rd27], %v0;");
}

/// The next output is pixel `at[0]` of channel `at[1]` of image `at[2]`.
#[derive(Debug)]
pub(crate) struct ConvRun<T> {
    conv: Conv,
    buffers: [usize; 3],
    pixels: usize,
    channels: usize,
    images: usize,
    at: [usize; 3],
    _element: std::marker::PhantomData<T>,
}

impl<T: Element + Send> KindRun<T> for ConvRun<T> {
    fn step(&mut self, memory: &mut [u8], work: usize) -> bool {
        let Self {
            conv,
            buffers,
            pixels,
            channels,
            images,
            at,
            ..
        } = self;
        {
            if *pixels == 0 || *channels == 0 {
                return true;
            }
            let per_pixel = (conv.c * conv.r * conv.s).max(1);
            let mut spent = 0;
            while at[2] < *images && spent < work {
                let [pq, ko, img] = *at;
                let [input, weight, _] = *buffers;
                let tensors = [&memory[input..], &memory[weight..]];
                let value = conv_pixel::<T>(conv, tensors, [pq, ko, img]);
                let index = (img * conv.k + ko) * conv.p * conv.q + pq;
                write(memory, buffers[2], index, &[value]);
                spent += per_pixel;
                *at = if pq + 1 < *pixels {
                    [pq + 1, ko, img]
                } else if ko + 1 < *channels {
                    [0, ko + 1, img]
                } else {
                    [0, 0, img + 1]
                };
            }
            at[2] >= *images
        }
    }

    fn parts(self: Box<Self>, workers: usize) -> Option<CpuParts> {
        let boxed = |part: Box<dyn CpuPart>| part;
        let Self {
            conv,
            buffers: [input, weight, output],
            pixels,
            channels,
            images,
            ..
        } = *self;
        disjoint({
            let conv = Arc::new(conv);
            let taps = conv.taps();
            let plane = 4 * conv.p * conv.q;
            let inputs = vec![
                input..input + images * conv.image_bytes(),
                weight..weight + 4 * conv.k * taps,
            ];
            if pixels == 0 {
                return Some(CpuParts {
                    inputs,
                    parts: Vec::new(),
                });
            }
            let parts = split(images * channels, pixels * taps, workers)
                .into_iter()
                .map(|rows| {
                    // Flat row `i` is output channel `i % channels` of image `i / channels`.
                    let first = (rows.start / channels) * conv.k + rows.start % channels;
                    let last = ((rows.end - 1) / channels) * conv.k + (rows.end - 1) % channels;
                    let range = output + plane * first..output + plane * (last + 1);
                    let part = ConvPart::<T> {
                        conv: conv.clone(),
                        pixels,
                        channels,
                        rows,
                        first,
                        exact: None,
                        pixel: 0,
                        packed: None,
                        gemm: None,
                    };
                    (range, boxed(Box::new(part)))
                })
                .collect();
            CpuParts { inputs, parts }
        })
    }
}

/// Dimensions of one convolution launch.
#[derive(Debug)]
pub(crate) struct Conv {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) k: usize,
    pub(crate) r: usize,
    pub(crate) s: usize,
    pub(crate) stride: usize,
    pub(crate) pad: usize,
    pub(crate) p: usize,
    pub(crate) q: usize,
}

impl Conv {
    /// Bytes of one input image.
    fn image_bytes(&self) -> usize {
        4 * self.c * self.h * self.w
    }

    /// Taps per output pixel.
    pub(crate) fn taps(&self) -> usize {
        self.c * self.r * self.s
    }
}

/// Output pixel `pq` of channel `ko` of image `img`: `x` is the input tensor's bytes, `w` the
/// weights'. The PTX's order: channels, then filter rows, then columns; taps in the padding are
/// skipped.
pub(crate) fn conv_pixel<T: Element>(
    conv: &Conv,
    [x, w]: [&[u8]; 2],
    [pq, ko, img]: [usize; 3],
) -> T {
    let load = |bytes: &[u8], index: usize| {
        let mut value = [T::ZERO];
        decode_into(&bytes[4 * index..4 * index + 4], &mut value);
        value[0]
    };
    let (p, q) = (pq / conv.q, pq % conv.q);
    let mut acc = T::ZERO;
    for ci in 0..conv.c {
        for r in 0..conv.r {
            let Some(ih) = (p * conv.stride + r).checked_sub(conv.pad) else {
                continue;
            };
            if ih >= conv.h {
                continue;
            }
            let row = ((img * conv.c + ci) * conv.h + ih) * conv.w;
            let taps = ((ko * conv.c + ci) * conv.r + r) * conv.s;
            for s in 0..conv.s {
                let Some(iw) = (q * conv.stride + s).checked_sub(conv.pad) else {
                    continue;
                };
                if iw < conv.w {
                    acc = acc.add(load(x, row + iw).mul(load(w, taps + s)));
                }
            }
        }
    }
    acc
}

/// Flat rows `rows` (image `i / channels`, output channel `i % channels`) of a convolution,
/// whose output range starts at output row `first` (`image * k + channel`).
struct ConvPart<T> {
    conv: Arc<Conv>,
    pixels: usize,
    channels: usize,
    rows: Range<usize>,
    first: usize,
    /// Whether the weights need the pixel-by-pixel path (decided at the first step).
    exact: Option<bool>,
    /// The pixel-by-pixel path: the next pixel of the row in progress.
    pixel: usize,
    /// The weights packed once for every image of the part (decided at the first step;
    /// `None` for a convolution too deep to pack whole, which multiplies image by image).
    packed: Option<Packed<T>>,
    /// The multiply of the image in progress, when the weights are not packed.
    gemm: Option<Gemm<T>>,
}

/// Fills `out` with the taps `tap` (`(ci, r, s)` in order) of an image's pixels `col0..`:
/// the input value each pixel's window reads there, zero in the padding.
fn tap_row<T: Element>(conv: &Conv, x: &[u8], tap: usize, col0: usize, out: &mut [T]) {
    let (ci, rs) = (tap / (conv.r * conv.s), tap % (conv.r * conv.s));
    let (r, s) = (rs / conv.s, rs % conv.s);
    // Output columns whose tap lies inside a row: `q · stride + s − pad` in `0..w`.
    let q_first = conv.pad.saturating_sub(s).div_ceil(conv.stride).min(conv.q);
    let q_end = (conv.w + conv.pad)
        .saturating_sub(s)
        .div_ceil(conv.stride)
        .clamp(q_first, conv.q);
    let mut pixel = col0;
    let mut filled = 0;
    while filled < out.len() {
        let (p, q0) = (pixel / conv.q, pixel % conv.q);
        let run = (conv.q - q0).min(out.len() - filled);
        let values = &mut out[filled..filled + run];
        match (p * conv.stride + r).checked_sub(conv.pad) {
            Some(ih) if ih < conv.h => {
                let line = &x[4 * (ci * conv.h + ih) * conv.w..][..4 * conv.w];
                let lo = q_first.clamp(q0, q0 + run);
                let hi = q_end.clamp(lo, q0 + run);
                values[..lo - q0].fill(T::ZERO);
                values[hi - q0..].fill(T::ZERO);
                let inside = &mut values[lo - q0..hi - q0];
                if conv.stride == 1 && lo < hi {
                    decode_into(&line[4 * (lo + s - conv.pad)..], inside);
                } else if lo < hi {
                    for (value, q) in inside.iter_mut().zip(lo..) {
                        *value = load(line, q * conv.stride + s - conv.pad);
                    }
                }
            }
            _ => values.fill(T::ZERO),
        }
        filled += run;
        pixel += run;
    }
}

/// One image's taps as the columns of a multiply: `b[(ci, r, s)][pixel]`.
struct Taps<'a> {
    conv: &'a Conv,
    /// The image's bytes.
    x: &'a [u8],
    /// The weights of the first output channel in the multiply onward.
    w: &'a [u8],
}

impl<T: Element> GemmSource<T> for Taps<'_> {
    fn a_row(&self, row: usize, p0: usize, out: &mut [T]) {
        decode_into(&self.w[4 * (row * self.conv.taps() + p0)..], out);
    }

    fn b_row(&self, tap: usize, col0: usize, out: &mut [T]) {
        tap_row(self.conv, self.x, tap, col0, out);
    }
}

impl<T: Element + Send> CpuPart for ConvPart<T> {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        let [x, w] = inputs else {
            return Err(internal("conv2d"));
        };
        let conv = self.conv.clone();
        let channels = self.channels;
        let exact = match self.exact {
            Some(exact) => exact,
            None => {
                // Every weight looked at (no early exit): a loop the compiler vectorises.
                let exact = w.chunks_exact(4).fold(false, |any, bytes| {
                    any | !T::from_le([bytes[0], bytes[1], bytes[2], bytes[3]]).is_finite()
                });
                if !exact && !self.rows.is_empty() {
                    // The part's channels: a range of one image's, or all of them.
                    let (start, last) = (self.rows.start, self.rows.end - 1);
                    let own = if start / channels == last / channels {
                        start % channels..last % channels + 1
                    } else {
                        0..channels
                    };
                    self.packed = Packed::new(&conv, w, own);
                }
                *self.exact.insert(exact)
            }
        };
        let mut spent = 0;
        while self.rows.start < self.rows.end && spent < STEP_WORK {
            let (img, ko) = (self.rows.start / channels, self.rows.start % channels);
            let row_out = img * conv.k + ko - self.first;
            let plane = conv.p * conv.q;
            if exact {
                let value: T = conv_pixel(&conv, [x, w], [self.pixel, ko, img]);
                let at = 4 * (row_out * plane + self.pixel);
                encode_into(&[value], &mut output[at..at + 4]);
                spent += conv.taps().max(1);
                self.pixel += 1;
                if self.pixel == self.pixels {
                    self.pixel = 0;
                    self.rows.start += 1;
                }
                continue;
            }
            // This image's remaining rows of the part.
            let end = self.rows.end.min((img + 1) * channels);
            let image = &x[img * conv.image_bytes()..];
            if let Some(packed) = &mut self.packed {
                let first = self.first;
                let out = |ko: usize| 4 * (img * conv.k + ko - first) * plane;
                let span = ko..ko + (end - self.rows.start);
                let (work, done) = packed.step(&conv, image, span, self.pixels, output, out);
                spent += work;
                if done {
                    self.rows.start = end;
                }
                continue;
            }
            // One multiply per image.
            let gemm = self.gemm.get_or_insert_with(|| {
                Gemm::new(end - self.rows.start, self.pixels, conv.taps(), plane)
            });
            let taps = Taps {
                conv: &conv,
                x: image,
                w: &w[4 * ko * conv.taps()..],
            };
            let done = gemm.step(&taps, &mut output[4 * row_out * plane..], GEMM_STEP);
            spent += STEP_WORK;
            if done {
                self.rows.start = end;
                self.gemm = None;
            }
        }
        Ok(self.rows.start >= self.rows.end)
    }
}
