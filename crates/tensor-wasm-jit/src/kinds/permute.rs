//! `permute[P]`: reorders the axes of a row-major tensor of 2 to 4 dimensions (ONNX
//! Transpose). `P` names the input axis of each output axis: with input dimensions `d`, the
//! output has dimensions `e[i] = d[P[i]]`, and output element `j` is the input element `i` with
//! `i[P[k]] = j[k]` for every `k`. `permute[10]` transposes a matrix; `permute[0213]` swaps
//! the middle axes (attention heads). Pure data movement: bits are copied, in f32 and in i32.
//!
//! Parameters: `x, out, d0, d1[, d2[, d3]]` (the input dimensions). A one-dimensional grid
//! over the output, `grid.x = ceil(d0 · d1 · ... / 256)`: thread `t` of block `b` writes
//! output element `b * 256 + t` (row-major), whatever the shape, so no thread idles on short
//! rows; writes coalesce, and reads do too when `P` keeps the last axis last. A smaller grid
//! writes only the elements before `grid.x * 256`.
//!
//! The CPU copy is blocked for both sides' caches: when `P` keeps the last axis last, each
//! output row is one contiguous input run; otherwise blocks of `TILE_A` × `TILE_B` elements
//! go through a buffer on the stack between the output axis that is the input's last
//! (contiguous reads) and the output's last (contiguous writes).

use std::fmt;

use tensor_wasm_gpu::{KernelArg, LaunchConfig};

use super::copy::{CopyOp, CopyRows, CopyRun, Cursor, Word};
use super::{blocks, product, Kind};
use crate::contract::{Param, ParamKind, Shape, BLOCK_1D};
use crate::cpu::{covered, Element, Stage};
use crate::emit::{global_index_1d, global_pointer, ins, Ops};
use crate::{Dtype, JitError};

/// The axis order of a `permute[P]`: output axis `i` is input axis `axes()[i]`.
///
/// Launch contract: `x, out, d0, d1[, d2[, d3]]` (the input dimensions), both buffers
/// `d0 · d1 · ...` elements, block `[256, 1, 1]`, grid `[ceil(d0 · d1 · ... / 256), 1, 1]`:
/// thread `t` of block `b` writes output element `b * 256 + t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Permutation {
    len: u8,
    /// The order; entries past `len` are 0.
    axes: [u8; 4],
}

impl Permutation {
    /// The order `axes` (2 to 4 of them), `None` for another count. Whether it is a
    /// permutation of `0..axes.len()` is one of the limits [`crate::Blueprint::new`] checks.
    pub fn new(axes: &[u8]) -> Option<Self> {
        if !(2..=4).contains(&axes.len()) {
            return None;
        }
        let mut all = [0; 4];
        all[..axes.len()].copy_from_slice(axes);
        Some(Permutation {
            len: axes.len() as u8,
            axes: all,
        })
    }

    /// The input axis of each output axis.
    pub fn axes(&self) -> &[u8] {
        &self.axes[..usize::from(self.len)]
    }

    fn len(&self) -> usize {
        usize::from(self.len)
    }
}

const SIZE_NAMES: [&str; 4] = ["d0", "d1", "d2", "d3"];

/// Output rows the CPU copies together across the output axis that is the input's last.
const TILE_A: usize = 64;
/// Output columns per tile.
const TILE_B: usize = 64;
/// Elements of a contiguous row copied per piece of a step.
const RUN_CHUNK: usize = 1 << 14;

/// The input dimensions of a shape, when it has `len` sizes.
fn dims(shape: &Shape, len: usize) -> Option<Vec<u32>> {
    let sizes = shape.sizes();
    (matches!(shape, Shape::Sizes { .. }) && sizes.len() == len).then_some(sizes)
}

impl Kind for Permutation {
    const NAME: &'static str = "permute";
    const EXAMPLES: &'static [&'static str] = &[
        "permute[10]",
        "permute[021]",
        "permute[120]",
        "permute[201]",
        "permute[0213]",
        "permute[1032]",
        "permute[3210]",
    ];

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        let axes: Vec<u8> = params.bytes().map(|b| b.wrapping_sub(b'0')).collect();
        match Permutation::new(&axes) {
            Some(order) if params.bytes().all(|b| b.is_ascii_digit()) => Ok(order),
            _ => Err(JitError::parse(
                descriptor,
                format!("{params:?} is not an axis order: 2 to 4 digits, e.g. 10 or 0213"),
            )),
        }
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.axes().iter().try_for_each(|axis| write!(f, "{axis}"))
    }

    fn check(&self, _dtype: Dtype) -> Result<(), String> {
        let len = self.len();
        let order: String = self.axes().iter().map(u8::to_string).collect();
        for (i, &axis) in self.axes().iter().enumerate() {
            if usize::from(axis) >= len {
                return Err(format!(
                    "permute[{order}]: axis {axis} does not exist in {len} dimensions (a \
                     permutation of 0..{len} is needed)"
                ));
            }
            if self.axes()[..i].contains(&axis) {
                return Err(format!(
                    "permute[{order}]: axis {axis} appears twice (a permutation of 0..{len} \
                     is needed)"
                ));
            }
        }
        Ok(())
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        let mut params = vec![
            Param::new("x", ParamKind::Input),
            Param::new("out", ParamKind::Output),
        ];
        params.extend(
            SIZE_NAMES[..self.len()]
                .iter()
                .map(|name| Param::new(name, ParamKind::U32)),
        );
        params
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let d = dims(shape, self.len())?;
        let total = product(&d).unwrap_or(u64::MAX);
        Some([blocks(total, u64::from(BLOCK_1D)), 1, 1])
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        (sizes.len() == self.len()).then(|| Shape::of_sizes(sizes))
    }

    fn buffer_elements(&self, shape: &Shape, _buffers: usize) -> Vec<Option<u64>> {
        let Some(d) = dims(shape, self.len()) else {
            return Vec::new();
        };
        vec![product(&d); 2]
    }

    fn emit(&self, _dtype: Dtype, _params: &[Param], _ops: &Ops, out: &mut String) {
        let n = self.len();
        let p: Vec<usize> = self.axes().iter().map(|&a| usize::from(a)).collect();
        // %rd20 + m: input dimension m; %rd24 + m: its stride in elements.
        for (m, name) in SIZE_NAMES[..n].iter().enumerate() {
            ins!(out, "ld.param.u32 %r10, [p_{name}];");
            ins!(out, "cvt.u64.u32 %rd{}, %r10;", 20 + m);
        }
        ins!(out, "mov.u64 %rd{}, 1;", 24 + n - 1);
        for m in (0..n - 1).rev() {
            ins!(
                out,
                "mul.lo.u64 %rd{}, %rd{}, %rd{};",
                24 + m,
                25 + m,
                21 + m
            );
        }
        // The element count: the input strides' first times its first dimension.
        ins!(out, "mul.lo.u64 %rd3, %rd24, %rd20;");
        global_index_1d(out);
        ins!(
            out,
            "setp.ge.u64 %p1, %rd1, %rd3; // guard: element < d0 * d1 * ..."
        );
        ins!(out, "@%p1 bra DONE;");
        // The input element: the output coordinates, last to first, times the strides of
        // their input axes.
        ins!(out, "mov.u64 %rd12, 0;");
        ins!(out, "mov.u64 %rd10, %rd1;");
        for k in (1..n).rev() {
            ins!(out, "rem.u64 %rd11, %rd10, %rd{};", 20 + p[k]);
            ins!(out, "div.u64 %rd10, %rd10, %rd{};", 20 + p[k]);
            ins!(out, "mad.lo.u64 %rd12, %rd11, %rd{}, %rd12;", 24 + p[k]);
        }
        ins!(out, "mad.lo.u64 %rd12, %rd10, %rd{}, %rd12;", 24 + p[0]);
        ins!(out, "shl.b64 %rd12, %rd12, 2;");
        global_pointer(out, 14, "x");
        ins!(out, "add.u64 %rd14, %rd14, %rd12;");
        ins!(out, "ld.global.b32 %v1, [%rd14];");
        ins!(out, "shl.b64 %rd13, %rd1, 2;");
        global_pointer(out, 15, "out");
        ins!(out, "add.u64 %rd15, %rd15, %rd13;");
        ins!(out, "st.global.b32 [%rd15], %v1;");
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let n = self.len();
        let (Some(d), &[x, out]) = (dims(shape, n), buffers) else {
            return Err(JitError::InvalidLaunch(format!("permute: {args:?}")));
        };
        // Validation checked both buffers against the memory, so every count fits in usize.
        let d: Vec<usize> = d.iter().map(|&v| v as usize).collect();
        let total: usize = d.iter().product();
        let (copy, rows) = PermuteCopy::new(self.axes(), &d, config);
        let input = x..x + 4 * total;
        Ok(Box::new(CopyRun::new(copy, rows, Vec::from([input]), out)))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        // One input axis may be long (past a block of 256), the others stay small: the
        // interpreter runs every element.
        let n = self.len();
        let long = dims[4] as usize % n;
        let small = if n == 4 { 5 } else { 7 };
        let sizes: Vec<u32> = (0..n)
            .map(|m| {
                if m == long {
                    dims[m] % 300
                } else {
                    dims[m] % small
                }
            })
            .collect();
        Shape::of_sizes(&sizes)
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        let (odd, large): (&[u32], &[u32]) = match self.len() {
            2 => (&[37, 301], &[1030, 2050]),
            3 => (&[5, 37, 129], &[130, 48, 257]),
            _ => (&[3, 5, 7, 37], &[16, 130, 12, 257]),
        };
        [Shape::of_sizes(odd), Shape::of_sizes(large)]
    }
}

/// A permute on the CPU, in element counts. Axes are output axes; `e` and `s` are 1 and 0
/// past `n`.
#[derive(Debug)]
struct PermuteCopy {
    n: usize,
    /// Output dimensions.
    e: [usize; 4],
    /// The input stride (elements) of each output axis.
    s: [usize; 4],
    /// The output axis that is the input's last (input stride 1).
    q: usize,
}

impl PermuteCopy {
    /// The copy of a permute by `axes` of an input of dimensions `d`, and the output rows
    /// `config` covers. A unit is one row when `P` keeps the last axis last (`q == n - 1`),
    /// else one index of the output axes up to `q`: every row below it, across the axes
    /// between `q` and `n - 1`.
    fn new(axes: &[u8], d: &[usize], config: &LaunchConfig) -> (Self, CopyRows) {
        let n = axes.len();
        let mut stride = [0; 4];
        stride[n - 1] = 1;
        for m in (0..n - 1).rev() {
            stride[m] = stride[m + 1] * d[m + 1];
        }
        let (mut e, mut s) = ([1; 4], [0; 4]);
        for (k, &axis) in axes.iter().enumerate() {
            e[k] = d[usize::from(axis)];
            s[k] = stride[usize::from(axis)];
        }
        let q = axes
            .iter()
            .position(|&axis| usize::from(axis) == n - 1)
            .unwrap_or(n - 1);
        let unit_rows = if q == n - 1 {
            1
        } else {
            e[q + 1..n - 1].iter().product()
        };
        let row_len = e[n - 1];
        let total: usize = e.iter().product();
        let limit = covered(config, 1, total as u64);
        let rows = CopyRows {
            row_len,
            rows: if row_len == 0 {
                0
            } else {
                limit.div_ceil(row_len)
            },
            cols: row_len,
            unit_rows: unit_rows.max(1),
            limit,
        };
        (PermuteCopy { n, e, s, q }, rows)
    }

    /// Output rows that are contiguous input runs: units are rows, each copied in pieces.
    fn copy_runs(
        &self,
        rows: &CopyRows,
        cursor: &mut Cursor,
        input: &[Word],
        out: &mut [Word],
        origin: usize,
        work: usize,
    ) {
        let row_axes = self.n - 1;
        let (dims, strides) = (&self.e[..row_axes], &self.s[..row_axes]);
        let mut at = Odometer::new(dims, strides, cursor.unit);
        let mut spent = 0;
        while cursor.unit < cursor.end && spent < work {
            let row = cursor.unit;
            let cols = rows.cols_of(row);
            let stop = cols.min(cursor.b + RUN_CHUNK);
            let to = (row - origin) * rows.row_len;
            out[to + cursor.b..to + stop]
                .copy_from_slice(&input[at.offset + cursor.b..at.offset + stop]);
            spent += stop - cursor.b + 8;
            if stop < cols {
                cursor.b = stop;
            } else {
                cursor.b = 0;
                cursor.unit += 1;
                at.advance(dims, strides);
            }
        }
    }

    /// Units that are tiles: rows `unit * unit_rows + m` for `TILE_A` consecutive units of the
    /// same outer index, read from `TILE_A` consecutive input elements per column. A block of
    /// `TILE_A` × `TILE_B` goes through a buffer on the stack: read run by run, written row by
    /// row, so every cache line is used whole while it is loaded, whatever the strides (a
    /// power-of-two stride maps a direct strided copy's lines onto one cache set).
    fn copy_tiles(
        &self,
        rows: &CopyRows,
        cursor: &mut Cursor,
        input: &[Word],
        out: &mut [Word],
        origin: usize,
        work: usize,
    ) {
        let (q, last) = (self.q, self.n - 1);
        let step = self.s[last];
        let along = self.e[q].max(1);
        let mut block = [[[0u8; 4]; TILE_A]; TILE_B];
        let mut spent = 0;
        while cursor.unit < cursor.end && spent < work {
            // The tile: units of the same outer index as the cursor's, at most TILE_A, of
            // which the first `live` have this row covered.
            let group_end = (cursor.unit / along + 1) * along;
            let tile = cursor.unit..cursor.end.min(group_end).min(cursor.unit + TILE_A);
            let row_of = |unit: usize| unit * rows.unit_rows + cursor.m;
            let live = tile.clone().take_while(|&u| row_of(u) < rows.rows).count();
            let outer = offset(&self.e[..q], &self.s[..q], cursor.unit / along);
            let middle = offset(&self.e[q + 1..last], &self.s[q + 1..last], cursor.m);
            let first = outer + middle + cursor.unit % along;
            let columns = cursor.b..rows.cols.min(cursor.b + TILE_B);
            for (runs, column) in block.iter_mut().zip(columns.clone()) {
                let from = first + column * step;
                runs[..live].copy_from_slice(&input[from..from + live]);
            }
            for t in 0..live {
                let row = row_of(cursor.unit + t);
                let stop = columns.end.min(rows.cols_of(row));
                if stop <= columns.start {
                    break;
                }
                let to = (row - origin) * rows.row_len;
                for (word, runs) in out[to + columns.start..to + stop].iter_mut().zip(&block) {
                    *word = runs[t];
                }
            }
            spent += tile.len() * columns.len() + 8;
            cursor.b = columns.end;
            if cursor.b >= rows.cols {
                cursor.b = 0;
                cursor.m += 1;
                if cursor.m >= rows.unit_rows {
                    cursor.m = 0;
                    cursor.unit = tile.end;
                }
            }
        }
    }
}

impl CopyOp for PermuteCopy {
    fn copy(
        &self,
        rows: &CopyRows,
        cursor: &mut Cursor,
        inputs: &[&[Word]],
        out: &mut [Word],
        origin: usize,
        work: usize,
    ) {
        if self.q == self.n - 1 {
            self.copy_runs(rows, cursor, inputs[0], out, origin, work);
        } else {
            self.copy_tiles(rows, cursor, inputs[0], out, origin, work);
        }
    }
}

/// Input offset of the `index`-th element (row-major) of axes of sizes `dims` and strides
/// `strides`.
fn offset(dims: &[usize], strides: &[usize], mut index: usize) -> usize {
    let mut at = 0;
    for (&dim, &stride) in dims.iter().zip(strides).rev() {
        at += index % dim * stride;
        index /= dim;
    }
    at
}

/// Row-major coordinates over some axes with their input offset, advanced one by one.
struct Odometer {
    coords: [usize; 4],
    offset: usize,
}

impl Odometer {
    /// The coordinates of the `index`-th element over `dims`.
    fn new(dims: &[usize], strides: &[usize], mut index: usize) -> Self {
        let mut coords = [0; 4];
        let mut at = 0;
        for (k, (&dim, &stride)) in dims.iter().zip(strides).enumerate().rev() {
            coords[k] = index % dim.max(1);
            at += coords[k] * stride;
            index /= dim.max(1);
        }
        Odometer { coords, offset: at }
    }

    /// The next element's coordinates (past the last: back to the first).
    fn advance(&mut self, dims: &[usize], strides: &[usize]) {
        for (k, (&dim, &stride)) in dims.iter().zip(strides).enumerate().rev() {
            self.coords[k] += 1;
            self.offset += stride;
            if self.coords[k] < dim {
                return;
            }
            self.offset -= stride * self.coords[k];
            self.coords[k] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Blueprint;

    #[test]
    fn orders_parse_to_their_canonical_form_and_others_are_refused() {
        for (text, canonical) in [
            ("permute[10]", "permute[10]:f32"),
            ("permute[021]:i32", "permute[021]:i32"),
            ("permute[0213]:f32", "permute[0213]:f32"),
            ("permute[3210]", "permute[3210]:f32"),
        ] {
            let blueprint = Blueprint::parse(text).unwrap();
            assert_eq!(blueprint.descriptor(), canonical);
            assert_eq!(Blueprint::parse(canonical), Ok(blueprint));
        }
        let blueprint = Blueprint::parse("permute[0213]:i32").unwrap();
        assert_eq!(blueprint.entry_name(), "tw_permute_0213_i32");
        for (text, says) in [
            ("permute[0]", "2 to 4 digits"),
            ("permute[01234]", "2 to 4 digits"),
            ("permute[]", "2 to 4 digits"),
            ("permute[1x]", "2 to 4 digits"),
            ("permute[-1]", "2 to 4 digits"),
            ("permute[00]", "appears twice"),
            ("permute[0112]", "appears twice"),
            ("permute[12]", "does not exist"),
            ("permute[0214]", "does not exist"),
        ] {
            let error = Blueprint::parse(text).expect_err(text).to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    proptest::proptest! {
        #[test]
        fn accepted_orders_are_permutations_and_round_trip(text in "[0-9a:-]{0,6}") {
            if let Ok(blueprint) = Blueprint::parse(&format!("permute[{text}]")) {
                let mut axes: Vec<u8> = text.bytes().map(|b| b - b'0').collect();
                axes.sort_unstable();
                proptest::prop_assert_eq!(axes, (0..text.len() as u8).collect::<Vec<_>>());
                proptest::prop_assert_eq!(Blueprint::parse(&blueprint.descriptor()), Ok(blueprint));
            }
        }
    }

    /// Runs `descriptor` on the CPU over input `0, 1, 2, ...` of dimensions `d` with the
    /// launch `config` (the full grid when `None`); returns the output words.
    fn run(descriptor: &str, d: &[u32], config: Option<LaunchConfig>) -> Vec<u32> {
        let blueprint = Blueprint::parse(descriptor).unwrap();
        let shape = Shape::of_sizes(d);
        let config = config.unwrap_or_else(|| blueprint.launch_config(&shape).unwrap());
        let total: u32 = d.iter().product();
        let bytes = 4 * total as u64;
        let mut memory = vec![0xeeu8; 2 * bytes as usize + 8];
        for i in 0..total as usize {
            memory[4 * i..4 * i + 4].copy_from_slice(&(i as u32).to_le_bytes());
        }
        let mut args = vec![
            KernelArg::Buffer {
                offset: 0,
                len: bytes,
            },
            KernelArg::Buffer {
                offset: bytes,
                len: bytes,
            },
        ];
        args.extend(d.iter().map(|&v| KernelArg::U32(v)));
        blueprint.run_cpu(&config, &args, &mut memory).unwrap();
        assert_eq!(&memory[2 * bytes as usize..], &[0xee; 8], "past the output");
        memory[bytes as usize..2 * bytes as usize]
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect()
    }

    /// The digits between the brackets of `descriptor`.
    fn axes_of(descriptor: &str) -> Vec<u8> {
        let start = descriptor.find('[').unwrap() + 1;
        let end = descriptor.find(']').unwrap();
        descriptor[start..end].bytes().map(|b| b - b'0').collect()
    }

    /// The definition: output `j` is input `i` with `i[P[k]] = j[k]`, row-major both.
    fn reference(axes: &[u8], d: &[u32]) -> Vec<u32> {
        let n = d.len();
        let e: Vec<u32> = axes.iter().map(|&a| d[usize::from(a)]).collect();
        let total: u32 = d.iter().product();
        (0..total)
            .map(|mut flat| {
                let mut j = vec![0; n];
                for k in (0..n).rev() {
                    j[k] = flat % e[k];
                    flat /= e[k];
                }
                let mut i = vec![0; n];
                for k in 0..n {
                    i[usize::from(axes[k])] = j[k];
                }
                i.iter().zip(d).fold(0, |at, (&c, &dim)| at * dim + c)
            })
            .collect()
    }

    #[test]
    fn a_transpose_moves_each_element_where_onnx_puts_it() {
        // in = [[0, 1, 2], [3, 4, 5]] -> out = [[0, 3], [1, 4], [2, 5]]
        assert_eq!(run("permute[10]", &[2, 3], None), [0, 3, 1, 4, 2, 5]);
        // in[a][b][c] of 2 x 2 x 3 -> out[c][a][b]
        assert_eq!(
            run("permute[201]", &[2, 2, 3], None),
            [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]
        );
    }

    #[test]
    fn every_order_of_the_examples_matches_the_definition_across_tiles() {
        // Sizes past a tile (64 x 64) and not multiples of it, so tiles end mid-axis.
        for (descriptor, d) in [
            ("permute[10]", &[37u32, 150][..]),
            ("permute[10]", &[150, 37]),
            ("permute[021]", &[3, 19, 70]),
            ("permute[120]", &[33, 5, 18]),
            ("permute[201]", &[4, 3, 20]),
            ("permute[0213]", &[2, 3, 5, 7]),
            ("permute[1032]", &[3, 2, 17, 67]),
            ("permute[3210]", &[2, 3, 4, 17]),
            ("permute[0123]", &[2, 3, 4, 5]),
        ] {
            let axes = axes_of(descriptor);
            for dtype in ["f32", "i32"] {
                let descriptor = format!("{descriptor}:{dtype}");
                assert_eq!(
                    run(&descriptor, d, None),
                    reference(&axes, d),
                    "{descriptor}"
                );
            }
        }
    }

    #[test]
    fn a_smaller_grid_writes_only_the_elements_before_its_end() {
        // 300 x 3 transposed (3 rows of 300) and 3 x 300 transposed (300 rows of 3), both
        // ending in the middle of a row, in tiles and in runs.
        for (descriptor, d) in [
            ("permute[10]:i32", &[300u32, 3][..]),
            ("permute[10]:f32", &[3, 300]),
            ("permute[021]:i32", &[1, 3, 300]),
            ("permute[0213]:f32", &[1, 3, 1, 300]),
        ] {
            let axes = axes_of(descriptor);
            let full = reference(&axes, d);
            let config = LaunchConfig {
                grid: [3, 1, 1],
                block: [256, 1, 1],
                shared_bytes: 0,
            };
            let out = run(descriptor, d, Some(config));
            for (i, (&got, &want)) in out.iter().zip(&full).enumerate() {
                let expected = if i < 768 { want } else { 0xeeee_eeee };
                assert_eq!(got, expected, "{descriptor}: element {i}");
            }
        }
    }
}
