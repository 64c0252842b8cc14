//! `bmm[XY]`: batched matrix multiply. For each of `batch` matrices `C_b (m × n) = op(A_b) ·
//! op(B_b)`, where `X` says how A is stored (`n`: each `A_b` is `m × k`; `t`: `k × m`,
//! transposed) and `Y` how B is (`n`: `k × n`; `t`: `n × k`). Everything is row-major, the
//! matrices of a batch one after another. f32 and i32.
//!
//! Numeric contract: matmul's, `c[i][j] = ((0 + a[i][0]·b[0][j]) + a[i][1]·b[1][j]) + ...` in
//! order of `p`, each product and sum rounded separately; so `bmm[nn]` gives the bits
//! `matmul` gives on each matrix.
//!
//! Parameters: `a, b, c, batch, m, n, k`. A row grid ([`RowGrid::Spread`]): grid row `r` is
//! row `r % m` of matrix `r / m` (`batch · m` rows of `n`), one output per thread with a loop
//! over `p`. On the CPU each part is a range of those rows, multiplied by the blocked GEMM
//! ([`tensor_wasm_gpu::gemm::Gemm`]) one matrix at a time; a transposed operand is copied into
//! the order the multiply reads when it is small, else gathered in place. Either keeps the
//! order of `p`, so the bits are the loop's.

use std::fmt;
use std::ops::Range;

use tensor_wasm_gpu::gemm::{decode_into, Gemm, GemmSource};
use tensor_wasm_gpu::{CpuPart, CpuParts, GpuError, KernelArg, LaunchConfig};
use zerocopy::FromBytes;

use super::rows::{load, spread_prologue, RowGrid};
use super::{product, Kind, KindRun};
use crate::contract::{Param, ParamKind, Shape};
use crate::cpu::{Element, Stage, STEP_WORK};
use crate::cpu_parts::{disjoint, split};
use crate::emit::{global_pointer, ins, label, Ops};
use crate::{Dtype, JitError};

/// How one operand of a `bmm` is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BmmOperand {
    /// As it is multiplied (`n`): A `m × k`, B `k × n`.
    Normal,
    /// Transposed (`t`): A stored `k × m`, B stored `n × k`.
    Transposed,
}

impl BmmOperand {
    fn letter(self) -> char {
        match self {
            BmmOperand::Normal => 'n',
            BmmOperand::Transposed => 't',
        }
    }
}

/// The operand layouts of `bmm[XY]`: `X` for A, `Y` for B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BmmLayout {
    /// How A is stored.
    pub a: BmmOperand,
    /// How B is stored.
    pub b: BmmOperand,
}

/// `batch, m, n, k` of a shape with four sizes.
fn dims(shape: &Shape) -> Option<[u32; 4]> {
    match shape {
        Shape::Sizes { .. } => shape.sizes().try_into().ok(),
        _ => None,
    }
}

impl Kind for BmmLayout {
    const NAME: &'static str = "bmm";
    const EXAMPLES: &'static [&'static str] = &["bmm[nn]", "bmm[nt]", "bmm[tn]", "bmm[tt]"];

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        let operand = |letter| match letter {
            'n' => Some(BmmOperand::Normal),
            't' => Some(BmmOperand::Transposed),
            _ => None,
        };
        let mut letters = params.chars();
        match (
            letters.next().and_then(operand),
            letters.next().and_then(operand),
            letters.next(),
        ) {
            (Some(a), Some(b), None) => Ok(BmmLayout { a, b }),
            _ => Err(JitError::parse(
                descriptor,
                "bmm takes two letters, n (normal) or t (transposed), for A then B, e.g. bmm[nt]",
            )),
        }
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.a.letter(), self.b.letter())
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        vec![
            Param::new("a", ParamKind::Input),
            Param::new("b", ParamKind::Input),
            Param::new("c", ParamKind::Output),
            Param::new("batch", ParamKind::U32),
            Param::new("m", ParamKind::U32),
            Param::new("n", ParamKind::U32),
            Param::new("k", ParamKind::U32),
        ]
    }

    fn grid_axes(&self) -> usize {
        RowGrid::Spread.axes()
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let [batch, m, n, _] = dims(shape)?;
        let rows = u64::from(batch) * u64::from(m);
        Some(RowGrid::Spread.grid(rows, u64::from(n)))
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        (sizes.len() == 4).then(|| Shape::of_sizes(sizes))
    }

    fn buffer_elements(&self, shape: &Shape, _buffers: usize) -> Vec<Option<u64>> {
        let Some([batch, m, n, k]) = dims(shape) else {
            return Vec::new();
        };
        vec![
            product(&[batch, m, k]),
            product(&[batch, k, n]),
            product(&[batch, m, n]),
        ]
    }

    fn emit(&self, _dtype: Dtype, _params: &[Param], ops: &Ops, out: &mut String) {
        bmm(out, ops, *self);
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let (Some(sizes), &[a, b, c]) = (dims(shape), buffers) else {
            return Err(JitError::InvalidLaunch(format!("bmm: {args:?}")));
        };
        // Validation checked every buffer against the memory, so these fit in usize.
        let [batch, m, n, k] = sizes.map(|size| size as usize);
        let (rows, cols) = RowGrid::Spread.covered(config, batch * m, n);
        let inputs = [a..a + 4 * batch * m * k, b..b + 4 * batch * k * n];
        let out = c..c + 4 * batch * m * n;
        let overlap = |x: &Range<usize>| !x.is_empty() && x.start < out.end && out.start < x.end;
        if !out.is_empty() && inputs.iter().any(overlap) {
            return Err(JitError::InvalidLaunch(
                "bmm: the output overlaps an input".into(),
            ));
        }
        let dims = Dims {
            layout: *self,
            m,
            n,
            k,
            cols,
        };
        let part = BmmPart {
            dims,
            first: 0,
            rows: 0..rows,
            multiply: None,
            a_rows: Vec::new(),
            b_rows: Vec::new(),
            spare: None,
        };
        Ok(Box::new(BmmRun { part, inputs, out }))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        // Rows past a block, columns past 256 (a second block of the row grid) at times.
        Shape::of_sizes(&[dims[0] % 4, dims[1] % 15, dims[2] % 263, dims[3] % 11])
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        [
            Shape::of_sizes(&[3, 37, 53, 29]),
            Shape::of_sizes(&[16, 128, 130, 64]),
        ]
    }
}

/// One thread per output: `%rd1` the grid row (`batch · m + i`), `%rd2` the column `j`, then
/// the sum over `p` with A and B walked by their strides.
fn bmm(out: &mut String, ops: &Ops, layout: BmmLayout) {
    for (reg, name) in [(20, "batch"), (21, "m"), (4, "n"), (22, "k")] {
        ins!(out, "ld.param.u32 %r4, [p_{name}];");
        ins!(out, "cvt.u64.u32 %rd{reg}, %r4;");
    }
    ins!(out, "mul.lo.u64 %rd3, %rd20, %rd21; // rows: batch * m");
    spread_prologue(out);
    ins!(out, "div.u64 %rd6, %rd1, %rd21; // the matrix");
    ins!(out, "mul.lo.u64 %rd7, %rd6, %rd21;");
    ins!(out, "sub.u64 %rd7, %rd1, %rd7; // i");
    // %rd8: element (i, 0) of op(A), %rd9: bytes per step of p.
    match layout.a {
        BmmOperand::Normal => {
            ins!(out, "mul.lo.u64 %rd8, %rd1, %rd22; // A[b][i][0]");
            ins!(out, "mov.u64 %rd9, 4;");
        }
        BmmOperand::Transposed => {
            ins!(out, "mul.lo.u64 %rd8, %rd6, %rd22;");
            ins!(out, "mad.lo.u64 %rd8, %rd8, %rd21, %rd7; // A[b][0][i]");
            ins!(out, "shl.b64 %rd9, %rd21, 2;");
        }
    }
    // %rd10: element (0, j) of op(B), %rd11: bytes per step of p.
    match layout.b {
        BmmOperand::Normal => {
            ins!(out, "mul.lo.u64 %rd10, %rd6, %rd22;");
            ins!(out, "mad.lo.u64 %rd10, %rd10, %rd4, %rd2; // B[b][0][j]");
            ins!(out, "shl.b64 %rd11, %rd4, 2;");
        }
        BmmOperand::Transposed => {
            ins!(out, "mad.lo.u64 %rd10, %rd6, %rd4, %rd2;");
            ins!(out, "mul.lo.u64 %rd10, %rd10, %rd22; // B[b][j][0]");
            ins!(out, "mov.u64 %rd11, 4;");
        }
    }
    global_pointer(out, 12, "a");
    ins!(out, "shl.b64 %rd8, %rd8, 2;");
    ins!(out, "add.u64 %rd12, %rd12, %rd8;");
    global_pointer(out, 13, "b");
    ins!(out, "shl.b64 %rd10, %rd10, 2;");
    ins!(out, "add.u64 %rd13, %rd13, %rd10;");
    ins!(out, "mov.b32 %v0, 0;");
    ins!(out, "mov.u64 %rd14, 0; // p");
    label!(out, "PRODUCT");
    ins!(out, "setp.ge.u64 %p2, %rd14, %rd22; // guard: p < k");
    ins!(out, "@%p2 bra PRODUCT_END;");
    ins!(out, "ld.global.b32 %v1, [%rd12];");
    ins!(out, "ld.global.b32 %v2, [%rd13];");
    ins!(out, "{} %v3, %v1, %v2;", ops.mul);
    ins!(out, "{} %v0, %v0, %v3;", ops.add);
    ins!(out, "add.u64 %rd12, %rd12, %rd9;");
    ins!(out, "add.u64 %rd13, %rd13, %rd11;");
    ins!(out, "add.u64 %rd14, %rd14, 1;");
    ins!(out, "bra PRODUCT;");
    label!(out, "PRODUCT_END");
    global_pointer(out, 15, "c");
    ins!(out, "mad.lo.u64 %rd16, %rd1, %rd4, %rd2; // C[b][i][j]");
    ins!(out, "shl.b64 %rd16, %rd16, 2;");
    ins!(out, "add.u64 %rd15, %rd15, %rd16;");
    ins!(out, "st.global.b32 [%rd15], %v0;");
}

/// A bmm launch's sizes on the CPU.
#[derive(Debug, Clone, Copy)]
struct Dims {
    layout: BmmLayout,
    m: usize,
    n: usize,
    k: usize,
    /// Columns of each row the launch covers.
    cols: usize,
}

/// Most values of a transposed operand a multiply copies into the order it reads (rows of
/// op(A), of op(B)) before it starts: about one step's work. A larger one is gathered in place
/// as it is packed.
const COPY_LIMIT: usize = STEP_WORK;

/// One matrix of a batch as a [`Gemm`]'s operands: its rows from `i0` on.
struct Operands<'a, T> {
    dims: Dims,
    /// The bytes of A and B of the matrix, from its first element.
    a: &'a [u8],
    b: &'a [u8],
    /// The row of C the multiply's row 0 is.
    i0: usize,
    /// Transposed operands copied: op(A)'s rows from `i0` (`k` values each), op(B)'s rows
    /// (`cols` values each).
    a_rows: Option<&'a [T]>,
    b_rows: Option<&'a [T]>,
}

impl<T: Element> GemmSource<T> for Operands<'_, T> {
    fn a_row(&self, row: usize, p0: usize, out: &mut [T]) {
        let Dims { m, k, .. } = self.dims;
        if let Some(rows) = self.a_rows {
            out.copy_from_slice(&rows[row * k + p0..][..out.len()]);
            return;
        }
        let i = self.i0 + row;
        match self.dims.layout.a {
            BmmOperand::Normal => decode_into(&self.a[4 * (i * k + p0)..], out),
            BmmOperand::Transposed => {
                for (value, p) in out.iter_mut().zip(p0..) {
                    *value = load(self.a, p * m + i);
                }
            }
        }
    }

    fn a_in_place(&self) -> Option<(&[T], usize)> {
        let k = self.dims.k;
        match (self.a_rows, self.dims.layout.a) {
            (Some(rows), _) => Some((rows, k)),
            (None, BmmOperand::Normal) => Some((in_place(&self.a[4 * self.i0 * k..])?, k)),
            (None, BmmOperand::Transposed) => None,
        }
    }

    fn b_in_place(&self) -> Option<(&[T], usize)> {
        match (self.b_rows, self.dims.layout.b) {
            (Some(rows), _) => Some((rows, self.dims.cols)),
            (None, BmmOperand::Normal) => Some((in_place(self.b)?, self.dims.n)),
            (None, BmmOperand::Transposed) => None,
        }
    }

    fn b_row(&self, p: usize, col0: usize, out: &mut [T]) {
        let Dims { n, k, cols, .. } = self.dims;
        if let Some(rows) = self.b_rows {
            out.copy_from_slice(&rows[p * cols + col0..][..out.len()]);
            return;
        }
        match self.dims.layout.b {
            BmmOperand::Normal => decode_into(&self.b[4 * (p * n + col0)..], out),
            BmmOperand::Transposed => {
                for (value, j) in out.iter_mut().zip(col0..) {
                    *value = load(self.b, j * k + p);
                }
            }
        }
    }
}

/// `bytes` (whole values of them) as `T`s where they lie: a little-endian host and 4-byte
/// alignment, else `None`.
fn in_place<T: Element>(bytes: &[u8]) -> Option<&[T]> {
    let whole = &bytes[..bytes.len() / 4 * 4];
    cfg!(target_endian = "little")
        .then(|| <[T]>::ref_from_bytes(whole).ok())
        .flatten()
}

/// Grid rows `rows` of a bmm (row `i` of matrix `b` is row `b · m + i`); its output starts at
/// row `first`.
struct BmmPart<T> {
    dims: Dims,
    first: usize,
    rows: Range<usize>,
    /// The multiply of the matrix in progress.
    multiply: Option<Multiply<T>>,
    /// Copies of transposed operands ([`Operands`]), kept for the next matrix.
    a_rows: Vec<T>,
    b_rows: Vec<T>,
    /// The last matrix's multiply, whose buffers the next one reuses.
    spare: Option<Gemm<T>>,
}

/// One matrix's multiply: rows up to `end` (before it), from copies of its transposed
/// operands where they were made.
struct Multiply<T> {
    gemm: Gemm<T>,
    end: usize,
    a_copied: bool,
    b_copied: bool,
}

impl<T: Element> BmmPart<T> {
    /// Computes about `work` multiply-adds from A and B into `output`; `true` once every row
    /// is written.
    fn advance(&mut self, [a, b]: [&[u8]; 2], output: &mut [u8], work: usize) -> bool {
        let Dims {
            layout,
            m,
            n,
            k,
            cols,
        } = self.dims;
        let mut spent = 0;
        while !self.rows.is_empty() && spent < work {
            let row = self.rows.start;
            let (matrix, i0) = (row / m, row % m);
            let (a, b) = (&a[4 * matrix * m * k..], &b[4 * matrix * k * n..]);
            if self.multiply.is_none() {
                let end = self.rows.end.min((matrix + 1) * m);
                let rows = end - row;
                let a_copied = layout.a == BmmOperand::Transposed && rows * k <= COPY_LIMIT;
                if a_copied {
                    // A is k × m: op(A)'s row i is column i.
                    self.a_rows.resize(rows * k, T::ZERO);
                    for p in 0..k {
                        let line = &a[4 * (p * m + i0)..][..4 * rows];
                        for (r, bytes) in line.chunks_exact(4).enumerate() {
                            self.a_rows[r * k + p] = load(bytes, 0);
                        }
                    }
                    spent += rows * k;
                }
                let b_copied = layout.b == BmmOperand::Transposed && k * cols <= COPY_LIMIT;
                if b_copied {
                    // B is n × k: op(B)'s row p is column p.
                    self.b_rows.resize(k * cols, T::ZERO);
                    for j in 0..cols {
                        let line = &b[4 * j * k..][..4 * k];
                        for (p, bytes) in line.chunks_exact(4).enumerate() {
                            self.b_rows[p * cols + j] = load(bytes, 0);
                        }
                    }
                    spent += k * cols;
                }
                let gemm = match self.spare.take() {
                    Some(mut gemm) => {
                        gemm.restart(rows, cols, k, n);
                        gemm
                    }
                    None => Gemm::new(rows, cols, k, n),
                };
                self.multiply = Some(Multiply {
                    gemm,
                    end,
                    a_copied,
                    b_copied,
                });
            }
            let Some(multiply) = &mut self.multiply else {
                break;
            };
            let source = Operands {
                dims: self.dims,
                a,
                b,
                i0,
                a_rows: multiply.a_copied.then_some(&self.a_rows[..]),
                b_rows: multiply.b_copied.then_some(&self.b_rows[..]),
            };
            let at = 4 * (row - self.first) * n;
            if multiply.gemm.step(&source, &mut output[at..], work) {
                spent += ((multiply.end - row) * cols * k).max(1);
                self.rows.start = multiply.end;
                self.spare = self.multiply.take().map(|multiply| multiply.gemm);
            } else {
                spent += work;
            }
        }
        self.rows.is_empty()
    }
}

impl<T: Element + Send> CpuPart for BmmPart<T> {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        let &[a, b] = inputs else {
            return Err(GpuError::Cuda(
                "bmm part got the wrong inputs (internal error)".into(),
            ));
        };
        Ok(self.advance([a, b], output, STEP_WORK))
    }
}

/// A bmm launch on the CPU: one part over every row, its operands read from guest memory.
struct BmmRun<T> {
    part: BmmPart<T>,
    /// Byte ranges of A and B (each disjoint from `out`, which `plan` checked).
    inputs: [Range<usize>; 2],
    /// Byte range of C.
    out: Range<usize>,
}

impl<T> fmt::Debug for BmmRun<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BmmRun")
            .field("dims", &self.part.dims)
            .field("rows", &self.part.rows)
            .field("inputs", &self.inputs)
            .field("out", &self.out)
            .finish()
    }
}

impl<T: Element + Send> KindRun<T> for BmmRun<T> {
    fn step(&mut self, memory: &mut [u8], work: usize) -> bool {
        if self.part.rows.is_empty() {
            return true;
        }
        let (before, rest) = memory.split_at_mut(self.out.start);
        let (output, after) = rest.split_at_mut(self.out.len());
        let (before, after): (&[u8], &[u8]) = (before, after);
        let out = &self.out;
        let view = |range: &Range<usize>| -> &[u8] {
            if range.is_empty() {
                &[]
            } else if range.end <= out.start {
                &before[range.clone()]
            } else {
                &after[range.start - out.end..range.end - out.end]
            }
        };
        let [a, b] = &self.inputs;
        self.part.advance([view(a), view(b)], output, work)
    }

    fn parts(self: Box<Self>, workers: usize) -> Option<CpuParts> {
        let BmmRun { part, inputs, out } = *self;
        let Dims { n, k, cols, .. } = part.dims;
        let parts = split(part.rows.len(), cols * k, workers)
            .into_iter()
            .map(|rows| {
                let bytes = out.start + 4 * rows.start * n..out.start + 4 * rows.end * n;
                let part = BmmPart::<T> {
                    dims: part.dims,
                    first: rows.start,
                    rows,
                    multiply: None,
                    a_rows: Vec::new(),
                    b_rows: Vec::new(),
                    spare: None,
                };
                (bytes, Box::new(part) as Box<dyn CpuPart>)
            })
            .collect();
        disjoint(CpuParts {
            inputs: inputs.to_vec(),
            parts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{first_difference, Rng};
    use crate::Blueprint;

    fn buffer(offset: usize, elements: usize) -> KernelArg {
        KernelArg::Buffer {
            offset: offset as u64,
            len: 4 * elements as u64,
        }
    }

    /// A launch of `descriptor` over `a` and `b` (as bits): the arguments and the memory, C
    /// after them filled with a canary.
    fn launch(
        [batch, m, n, k]: [usize; 4],
        a: &[u32],
        b: &[u32],
    ) -> (Vec<KernelArg>, Vec<u8>, usize) {
        let c_at = 4 * (a.len() + b.len());
        let mut memory: Vec<u8> = a.iter().chain(b).flat_map(|w| w.to_le_bytes()).collect();
        memory.extend(0xdead_beef_u32.to_le_bytes().repeat(batch * m * n));
        let args = vec![
            buffer(0, a.len()),
            buffer(4 * a.len(), b.len()),
            buffer(c_at, batch * m * n),
            KernelArg::U32(batch as u32),
            KernelArg::U32(m as u32),
            KernelArg::U32(n as u32),
            KernelArg::U32(k as u32),
        ];
        (args, memory, c_at)
    }

    fn words(memory: &[u8]) -> Vec<u32> {
        memory
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect()
    }

    /// C by the contract's loop, straight from its definition (bits in and out).
    fn naive<T: Element>(
        layout: BmmLayout,
        [batch, m, n, k]: [usize; 4],
        a: &[u32],
        b: &[u32],
    ) -> Vec<u32> {
        let value = |bits: u32| T::from_le(bits.to_le_bytes());
        let mut c = Vec::new();
        for matrix in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let mut sum = T::ZERO;
                    for p in 0..k {
                        let x = match layout.a {
                            BmmOperand::Normal => a[(matrix * m + i) * k + p],
                            BmmOperand::Transposed => a[(matrix * k + p) * m + i],
                        };
                        let y = match layout.b {
                            BmmOperand::Normal => b[(matrix * k + p) * n + j],
                            BmmOperand::Transposed => b[(matrix * n + j) * k + p],
                        };
                        sum = sum.add(value(x).mul(value(y)));
                    }
                    c.push(u32::from_le_bytes(sum.to_le()));
                }
            }
        }
        c
    }

    #[test]
    fn descriptors_parse_and_print_canonically() {
        for (text, a, b) in [
            ("bmm[nn]", BmmOperand::Normal, BmmOperand::Normal),
            ("bmm[nt]", BmmOperand::Normal, BmmOperand::Transposed),
            ("bmm[tn]", BmmOperand::Transposed, BmmOperand::Normal),
            (
                "bmm[tt]:i32",
                BmmOperand::Transposed,
                BmmOperand::Transposed,
            ),
        ] {
            let blueprint = Blueprint::parse(text).unwrap();
            assert_eq!(
                *blueprint.kind(),
                crate::BlueprintKind::Bmm(BmmLayout { a, b })
            );
            assert!(blueprint.descriptor().starts_with(&text[..7]));
        }
        assert_eq!(
            Blueprint::parse("bmm[nt]").unwrap().entry_name(),
            "tw_bmm_nt_f32"
        );
        for bad in [
            "bmm[]", "bmm[n]", "bmm[ntn]", "bmm[nx]", "bmm[NT]", "bmm[1]",
        ] {
            let error = Blueprint::parse(bad).unwrap_err().to_string();
            assert!(error.contains("bmm takes two letters"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_small_batch_matches_a_hand_computed_product() {
        // Two 2 × 2 matrices with k = 3; A_0 = [[1, 2, 3], [4, 5, 6]], A_1 = -A_0,
        // B_0 = [[1, 0], [0, 1], [1, 1]], B_1 = [[2, 0], [0, 2], [0, 0]].
        let a_rows: [[f32; 3]; 4] = [[1., 2., 3.], [4., 5., 6.], [-1., -2., -3.], [-4., -5., -6.]];
        let b_rows: [[f32; 2]; 6] = [[1., 0.], [0., 1.], [1., 1.], [2., 0.], [0., 2.], [0., 0.]];
        let expected = [4., 5., 10., 11., -2., -4., -8., -10.];
        for layout in [(false, false), (false, true), (true, false), (true, true)] {
            // The same products, A and B stored transposed where the layout says so.
            let a: Vec<u32> = (0..2)
                .flat_map(|matrix| {
                    let rows = &a_rows[2 * matrix..2 * matrix + 2];
                    if layout.0 {
                        (0..3)
                            .flat_map(|p| (0..2).map(move |i| rows[i][p]))
                            .collect::<Vec<_>>()
                    } else {
                        rows.iter().flatten().copied().collect()
                    }
                })
                .map(f32::to_bits)
                .collect();
            let b: Vec<u32> = (0..2)
                .flat_map(|matrix| {
                    let rows = &b_rows[3 * matrix..3 * matrix + 3];
                    if layout.1 {
                        (0..2)
                            .flat_map(|j| (0..3).map(move |p| rows[p][j]))
                            .collect::<Vec<_>>()
                    } else {
                        rows.iter().flatten().copied().collect()
                    }
                })
                .map(f32::to_bits)
                .collect();
            let letter = |t: bool| if t { 't' } else { 'n' };
            let blueprint =
                Blueprint::parse(&format!("bmm[{}{}]", letter(layout.0), letter(layout.1)))
                    .unwrap();
            let (args, mut memory, c_at) = launch([2, 2, 2, 3], &a, &b);
            let config = blueprint
                .launch_config(&Shape::of_sizes(&[2, 2, 2, 3]))
                .unwrap();
            assert_eq!(config.grid, [4, 1, 1]);
            blueprint.run_cpu(&config, &args, &mut memory).unwrap();
            let c: Vec<f32> = words(&memory[c_at..])
                .into_iter()
                .map(f32::from_bits)
                .collect();
            assert_eq!(c, expected, "{blueprint}");
        }
    }

    /// The blocked multiply, in one run and in parts, against the contract's loop: shapes
    /// past the GEMM's blocks (12 rows, 16 columns, 96 rows, 256 values of `p`), transposed
    /// operands copied first or gathered in place, edge values
    /// (NaN, infinities, subnormals, full-range integers), every layout, and grids that cover
    /// only some rows or columns.
    #[test]
    fn the_cpu_run_and_its_parts_give_the_loops_bits() {
        let shapes = [
            [1, 1, 1, 1],
            [3, 13, 17, 5],
            [2, 100, 40, 300],
            [4, 7, 300, 3],
            [2, 5, 6, 0],
            [0, 4, 4, 4],
            [3, 0, 4, 4],
            // Transposed operands past COPY_LIMIT, gathered while packing.
            [1, 600, 3, 520],
            [1, 3, 600, 520],
        ];
        let mut rng = Rng(7);
        for dtype in [Dtype::F32, Dtype::I32] {
            for layout in BmmLayout::EXAMPLES {
                let blueprint = Blueprint::parse(&format!("{layout}:{}", dtype.as_str())).unwrap();
                let crate::BlueprintKind::Bmm(layout) = *blueprint.kind() else {
                    unreachable!("a bmm blueprint");
                };
                for dims @ [batch, m, n, k] in shapes {
                    let a: Vec<u32> = (0..batch * m * k).map(|_| rng.bits(dtype)).collect();
                    let b: Vec<u32> = (0..batch * k * n).map(|_| rng.bits(dtype)).collect();
                    let expected = match dtype {
                        Dtype::F32 => naive::<f32>(layout, dims, &a, &b),
                        Dtype::I32 => naive::<i32>(layout, dims, &a, &b),
                    };
                    let sizes = dims.map(|d| d as u32);
                    let full = blueprint.launch_config(&Shape::of_sizes(&sizes)).unwrap();
                    let mut short = full;
                    short.grid[0] = (full.grid[0] - 1).max(1);
                    let mut narrow = full;
                    narrow.grid[1] = (full.grid[1] - 1).max(1);
                    for config in [full, short, narrow] {
                        let (args, memory, c_at) = launch(dims, &a, &b);
                        let rows = (batch * m).min(config.grid[0] as usize);
                        let cols = n.min(256 * config.grid[1] as usize);
                        let mut want = words(&memory[c_at..]);
                        for row in 0..rows {
                            want[row * n..row * n + cols]
                                .copy_from_slice(&expected[row * n..row * n + cols]);
                        }
                        let want: Vec<u8> = want.iter().flat_map(|w| w.to_le_bytes()).collect();
                        let mut run = memory.clone();
                        blueprint.run_cpu(&config, &args, &mut run).unwrap();
                        let mut parted = memory.clone();
                        blueprint
                            .cpu_parts(&config, &args, parted.len(), 3)
                            .unwrap()
                            .expect("parts")
                            .run_in_order(&mut parted)
                            .unwrap();
                        for (what, memory) in [("run", &run), ("parts", &parted)] {
                            if let Some(difference) =
                                first_difference(dtype, &want, &memory[c_at..])
                            {
                                panic!("{blueprint} {dims:?} {config:?} {what}: {difference}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bmm_nn_gives_matmuls_bits_on_each_matrix() {
        let (m, n, k) = (5usize, 7usize, 9usize);
        let mut rng = Rng(11);
        let a: Vec<u32> = (0..2 * m * k).map(|_| rng.f32_bits()).collect();
        let b: Vec<u32> = (0..2 * k * n).map(|_| rng.f32_bits()).collect();
        let bmm = Blueprint::parse("bmm[nn]").unwrap();
        let (args, mut memory, c_at) = launch([2, m, n, k], &a, &b);
        let config = bmm.launch_config(&Shape::of_sizes(&[2, 5, 7, 9])).unwrap();
        bmm.run_cpu(&config, &args, &mut memory).unwrap();
        let matmul = Blueprint::parse("matmul[4x4x4]").unwrap();
        let shape = Shape::Matmul { m: 5, n: 7, k: 9 };
        for matrix in 0..2 {
            let (a, b) = (&a[matrix * m * k..][..m * k], &b[matrix * k * n..][..k * n]);
            let (mut args, mut single, c1) = launch([1, m, n, k], a, b);
            args.remove(3);
            let config = matmul.launch_config(&shape).unwrap();
            matmul.run_cpu(&config, &args, &mut single).unwrap();
            let c = &memory[c_at + 4 * matrix * m * n..][..4 * m * n];
            assert_eq!(first_difference(Dtype::F32, &single[c1..], c), None);
        }
    }

    #[test]
    fn the_ptx_walks_each_layouts_strides() {
        let ptx = |d: &str| {
            Blueprint::parse(d)
                .unwrap()
                .emit_ptx(&crate::PtxTarget::default())
        };
        assert!(ptx("bmm[nn]").contains("mov.u64 %rd9, 4;"));
        assert!(ptx("bmm[tn]").contains("shl.b64 %rd9, %rd21, 2;"));
        assert!(ptx("bmm[nn]").contains("shl.b64 %rd11, %rd4, 2;"));
        assert!(ptx("bmm[nt]").contains("mov.u64 %rd11, 4;"));
        assert!(ptx("bmm[tt]:i32").contains("mul.lo.s32 %v3, %v1, %v2;"));
        assert!(ptx("bmm[tt]").contains("add.rn.f32 %v0, %v0, %v3;"));
    }
}
