//! `matmul[TMxTNxTK]`: C (m × n) = A (m × k) · B (k × n), row-major, by shared-memory tiles.

use std::fmt;

use tensor_wasm_gpu::gemm::{Gemm, Matrices};
use tensor_wasm_gpu::{CpuPart, CpuParts, GpuError, KernelArg, LaunchConfig};

use super::{blocks, parse_int, product, Kind, KindRun};
use crate::blueprint::{MAX_SHARED, MAX_THREADS};
use crate::contract::{Param, ParamKind, Shape};
use crate::cpu::{load, load_into, write, Element, Stage};
use crate::cpu_parts::{disjoint, internal, split, GEMM_STEP};
use crate::emit::{global_pointer, ins, label, Ops};
use crate::{Dtype, JitError};

/// Tile of a shared-memory tiled matmul: a block computes `m` × `n` outputs with one thread each
/// (block = `[n, m, 1]`) and stages `k` columns of A and rows of B per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatmulTile {
    /// Output rows per block (block y).
    pub m: u32,
    /// Output columns per block (block x).
    pub n: u32,
    /// Depth of one shared-memory step.
    pub k: u32,
}

/// The GPU suite's shapes: one odd-sized, one larger than a tile in every direction.
/// Matmul: output rows summed together, sharing each row of b while it is in L1.
const MATMUL_ROWS: usize = 4;

/// The GPU suite's shapes.
const SUITE_SHAPES: [Shape; 2] = [
    Shape::Matmul {
        m: 37,
        n: 53,
        k: 29,
    },
    Shape::Matmul {
        m: 130,
        n: 96,
        k: 257,
    },
];

impl Kind for MatmulTile {
    const NAME: &'static str = "matmul";
    const EXAMPLES: &'static [&'static str] = &[
        "matmul[16x16x16]",
        "matmul[32x32x8]",
        "matmul[8x32x4]",
        "matmul[1x1x1]",
        "matmul[64x16x64]",
        "matmul[3x5x7]",
        "matmul[4x4x8]",
        "matmul[2x64x3]",
    ];

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        let sides: Vec<&str> = params.split('x').collect();
        let [m, n, k] = sides[..] else {
            return Err(JitError::parse(
                descriptor,
                "matmul takes a tile MxNxK, e.g. matmul[16x16x16]",
            ));
        };
        Ok(MatmulTile {
            m: parse_int(descriptor, m)?,
            n: parse_int(descriptor, n)?,
            k: parse_int(descriptor, k)?,
        })
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}x{}", self.m, self.n, self.k)
    }

    fn check(&self, _dtype: Dtype) -> Result<(), String> {
        for (side, value) in [("m", self.m), ("n", self.n), ("k", self.k)] {
            if !(1..=64).contains(&value) {
                return Err(format!("matmul tile {side} must be in 1..=64, not {value}"));
            }
        }
        if self.m * self.n > MAX_THREADS {
            return Err(format!(
                "matmul tile {}x{} needs {} threads per block, more than {MAX_THREADS}",
                self.m,
                self.n,
                self.m * self.n
            ));
        }
        let shared = 4 * (self.m * self.k + self.k * self.n);
        if shared > MAX_SHARED {
            return Err(format!(
                "matmul tile needs {shared} bytes of shared memory, more than {MAX_SHARED}"
            ));
        }
        Ok(())
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        vec![
            Param::new("a", ParamKind::Input),
            Param::new("b", ParamKind::Input),
            Param::new("c", ParamKind::Output),
            Param::new("m", ParamKind::U32),
            Param::new("n", ParamKind::U32),
            Param::new("k", ParamKind::U32),
        ]
    }

    fn block(&self) -> [u32; 3] {
        [self.n, self.m, 1]
    }

    fn grid_axes(&self) -> usize {
        2
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let Shape::Matmul { m, n, .. } = shape else {
            return None;
        };
        Some([
            blocks(u64::from(*n), u64::from(self.n)),
            blocks(u64::from(*m), u64::from(self.m)),
            1,
        ])
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        match sizes {
            &[m, n, k] => Some(Shape::Matmul { m, n, k }),
            _ => None,
        }
    }

    fn buffer_elements(&self, shape: &Shape, _buffers: usize) -> Vec<Option<u64>> {
        match *shape {
            Shape::Matmul { m, n, k } => vec![product(&[m, k]), product(&[k, n]), product(&[m, n])],
            _ => Vec::new(),
        }
    }

    fn shared_ptx(&self, _dtype: Dtype) -> String {
        format!(
            ".shared .align 4 .b32 tile_a[{}];\n.shared .align 4 .b32 tile_b[{}];\n\n",
            self.m * self.k,
            self.k * self.n
        )
    }

    fn emit(&self, _dtype: Dtype, _params: &[Param], ops: &Ops, out: &mut String) {
        matmul(out, ops, *self);
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        _args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let (Shape::Matmul { m, n, k }, &[a, b, c]) = (*shape, buffers) else {
            return Err(JitError::InvalidLaunch("matmul takes three buffers".into()));
        };
        let rows = (u64::from(config.grid[1]) * u64::from(self.m)).min(u64::from(m));
        let cols = (u64::from(config.grid[0]) * u64::from(self.n)).min(u64::from(n));
        Ok(Box::new(MatmulRun {
            a,
            b,
            c,
            n: n as usize,
            k: k as usize,
            rows: rows as usize,
            cols: cols as usize,
            i: 0,
            p: 0,
            b_values: Vec::new(),
            acc: Vec::new(),
        }))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        Shape::Matmul {
            m: dims[0] % 21,
            n: dims[1] % 21,
            k: dims[2] % 21,
        }
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        SUITE_SHAPES
    }
}

/// Shared-memory tiled matmul. Each step stages `a[row0.., k0..k0+tk]` and
/// `b[k0..k0+tk, col0..]` (zero outside the matrices), then every thread accumulates
/// `min(tk, k - k0)` products in order of p, so the sum order is p = 0..k as on the CPU.
fn matmul(out: &mut String, ops: &Ops, tile: MatmulTile) {
    let MatmulTile {
        m: tm,
        n: tn,
        k: tk,
    } = tile;
    ins!(out, "mov.u32 %r1, %tid.x;");
    ins!(out, "mov.u32 %r2, %tid.y;");
    ins!(out, "mov.u32 %r3, %ctaid.x;");
    ins!(out, "mov.u32 %r4, %ctaid.y;");
    ins!(
        out,
        "mad.lo.u32 %r5, %r2, {tn}, %r1; // linear thread index"
    );
    ins!(out, "mul.wide.u32 %rd3, %r4, {tm}; // row0");
    ins!(out, "mul.wide.u32 %rd4, %r3, {tn}; // col0");
    ins!(out, "cvt.u64.u32 %rd1, %r2;");
    ins!(out, "add.u64 %rd1, %rd1, %rd3; // row");
    ins!(out, "cvt.u64.u32 %rd2, %r1;");
    ins!(out, "add.u64 %rd2, %rd2, %rd4; // col");
    for (reg, name) in [(5, "m"), (6, "n"), (7, "k")] {
        ins!(out, "ld.param.u32 %r6, [p_{name}];");
        ins!(out, "cvt.u64.u32 %rd{reg}, %r6;");
    }
    global_pointer(out, 10, "a");
    global_pointer(out, 11, "b");
    global_pointer(out, 12, "c");
    ins!(out, "mov.u32 %r10, tile_a;");
    ins!(out, "mov.u32 %r11, tile_b;");
    ins!(out, "mov.b32 %v0, 0;");
    ins!(out, "mov.u64 %rd8, 0; // k0");
    label!(out, "TILE");
    ins!(out, "setp.ge.u64 %p1, %rd8, %rd7;");
    ins!(out, "@%p1 bra TILE_END;");
    // Stage A: element idx of the tile is a[row0 + idx / tk][k0 + idx % tk].
    ins!(out, "mov.u32 %r6, %r5;");
    label!(out, "LOAD_A");
    ins!(out, "setp.ge.u32 %p2, %r6, {};", tm * tk);
    ins!(out, "@%p2 bra LOAD_A_END;");
    ins!(out, "div.u32 %r7, %r6, {tk};");
    ins!(out, "rem.u32 %r8, %r6, {tk};");
    ins!(out, "cvt.u64.u32 %rd13, %r7;");
    ins!(out, "add.u64 %rd13, %rd13, %rd3;");
    ins!(out, "cvt.u64.u32 %rd14, %r8;");
    ins!(out, "add.u64 %rd14, %rd14, %rd8;");
    ins!(out, "mov.b32 %v1, 0;");
    ins!(out, "setp.lt.u64 %p3, %rd13, %rd5;");
    ins!(
        out,
        "setp.lt.and.u64 %p3, %rd14, %rd7, %p3; // guard: r < m && p < k"
    );
    ins!(out, "@!%p3 bra STORE_A;");
    ins!(out, "mad.lo.u64 %rd15, %rd13, %rd7, %rd14;");
    ins!(out, "shl.b64 %rd15, %rd15, 2;");
    ins!(out, "add.u64 %rd15, %rd10, %rd15;");
    ins!(out, "ld.global.b32 %v1, [%rd15];");
    label!(out, "STORE_A");
    ins!(out, "shl.b32 %r9, %r6, 2;");
    ins!(out, "add.u32 %r9, %r9, %r10;");
    ins!(out, "st.shared.b32 [%r9], %v1;");
    ins!(out, "add.u32 %r6, %r6, {};", tm * tn);
    ins!(out, "bra LOAD_A;");
    label!(out, "LOAD_A_END");
    // Stage B: element idx of the tile is b[k0 + idx / tn][col0 + idx % tn].
    ins!(out, "mov.u32 %r6, %r5;");
    label!(out, "LOAD_B");
    ins!(out, "setp.ge.u32 %p2, %r6, {};", tk * tn);
    ins!(out, "@%p2 bra LOAD_B_END;");
    ins!(out, "div.u32 %r7, %r6, {tn};");
    ins!(out, "rem.u32 %r8, %r6, {tn};");
    ins!(out, "cvt.u64.u32 %rd13, %r7;");
    ins!(out, "add.u64 %rd13, %rd13, %rd8;");
    ins!(out, "cvt.u64.u32 %rd14, %r8;");
    ins!(out, "add.u64 %rd14, %rd14, %rd4;");
    ins!(out, "mov.b32 %v1, 0;");
    ins!(out, "setp.lt.u64 %p3, %rd13, %rd7;");
    ins!(
        out,
        "setp.lt.and.u64 %p3, %rd14, %rd6, %p3; // guard: p < k && c < n"
    );
    ins!(out, "@!%p3 bra STORE_B;");
    ins!(out, "mad.lo.u64 %rd15, %rd13, %rd6, %rd14;");
    ins!(out, "shl.b64 %rd15, %rd15, 2;");
    ins!(out, "add.u64 %rd15, %rd11, %rd15;");
    ins!(out, "ld.global.b32 %v1, [%rd15];");
    label!(out, "STORE_B");
    ins!(out, "shl.b32 %r9, %r6, 2;");
    ins!(out, "add.u32 %r9, %r9, %r11;");
    ins!(out, "st.shared.b32 [%r9], %v1;");
    ins!(out, "add.u32 %r6, %r6, {};", tm * tn);
    ins!(out, "bra LOAD_B;");
    label!(out, "LOAD_B_END");
    ins!(out, "bar.sync 0;");
    // Accumulate only the products with p < k, in order.
    ins!(out, "sub.u64 %rd16, %rd7, %rd8;");
    ins!(out, "min.u64 %rd16, %rd16, {tk};");
    ins!(out, "cvt.u32.u64 %r12, %rd16;");
    ins!(out, "mov.u32 %r13, 0;");
    ins!(
        out,
        "mad.lo.u32 %r14, %r2, {}, %r10; // &tile_a[ty][0]",
        tk * 4
    );
    ins!(out, "shl.b32 %r15, %r1, 2;");
    ins!(out, "add.u32 %r15, %r15, %r11; // &tile_b[0][tx]");
    label!(out, "INNER");
    ins!(out, "setp.ge.u32 %p4, %r13, %r12;");
    ins!(out, "@%p4 bra INNER_END;");
    ins!(out, "ld.shared.b32 %v2, [%r14];");
    ins!(out, "ld.shared.b32 %v3, [%r15];");
    ins!(out, "{} %v4, %v2, %v3;", ops.mul);
    ins!(out, "{} %v0, %v0, %v4;", ops.add);
    ins!(out, "add.u32 %r14, %r14, 4;");
    ins!(out, "add.u32 %r15, %r15, {};", tn * 4);
    ins!(out, "add.u32 %r13, %r13, 1;");
    ins!(out, "bra INNER;");
    label!(out, "INNER_END");
    ins!(out, "bar.sync 0;");
    ins!(out, "add.u64 %rd8, %rd8, {tk};");
    ins!(out, "bra TILE;");
    label!(out, "TILE_END");
    ins!(out, "setp.ge.u64 %p5, %rd1, %rd5; // guard: row < m");
    ins!(out, "@%p5 bra DONE;");
    ins!(out, "setp.ge.u64 %p6, %rd2, %rd6; // guard: col < n");
    ins!(out, "@%p6 bra DONE;");
    ins!(out, "mad.lo.u64 %rd17, %rd1, %rd6, %rd2;");
    ins!(out, "shl.b64 %rd17, %rd17, 2;");
    ins!(out, "add.u64 %rd17, %rd12, %rd17;");
    ins!(out, "st.global.b32 [%rd17], %v0;");
}

/// Output rows `i..rows` are left; rows `i..i + MATMUL_ROWS` are summed up to `p` in
/// `acc` (row by row, `cols` each). `b_values` is b, decoded at the first step.
#[derive(Debug)]
pub(crate) struct MatmulRun<T> {
    a: usize,
    b: usize,
    c: usize,
    n: usize,
    k: usize,
    rows: usize,
    cols: usize,
    i: usize,
    p: usize,
    b_values: Vec<T>,
    acc: Vec<T>,
}

impl<T: Element + Send> KindRun<T> for MatmulRun<T> {
    fn step(&mut self, memory: &mut [u8], work: usize) -> bool {
        let Self {
            a,
            b,
            c,
            n,
            k,
            rows,
            cols,
            i,
            p,
            b_values,
            acc,
        } = self;
        {
            if *cols == 0 || *rows == 0 {
                return true;
            }
            if b_values.is_empty() && *k > 0 {
                // b as it is when the launch starts, decoded once: every tile reads it.
                b_values.resize(*k * *n, T::ZERO);
                load_into(memory, *b, b_values);
                acc.resize(MATMUL_ROWS * *cols, T::ZERO);
            }
            let (cols, n, k) = (*cols, *n, *k);
            let mut spent = 0;
            while *i < *rows {
                let tile = MATMUL_ROWS.min(*rows - *i);
                // i-p-j order: each output's products still arrive in order of p; row p
                // of b serves the tile's rows while it is in L1.
                while *p < k {
                    let b_row = &b_values[*p * n..][..cols];
                    for (r, sums) in acc.chunks_exact_mut(cols).take(tile).enumerate() {
                        let a_ip = load::<T>(memory, *a, (*i + r) * k + *p);
                        for (sum, &b_pj) in sums.iter_mut().zip(b_row) {
                            *sum = sum.add(a_ip.mul(b_pj));
                        }
                    }
                    *p += 1;
                    spent += cols * tile;
                    if spent >= work && *p < k {
                        return false;
                    }
                }
                if k == 0 {
                    acc.resize(MATMUL_ROWS * cols, T::ZERO);
                }
                for (r, sums) in acc.chunks_exact(cols).take(tile).enumerate() {
                    write(memory, *c, (*i + r) * n, sums);
                }
                acc.fill(T::ZERO);
                *p = 0;
                *i += tile;
                spent += cols * tile;
                if spent >= work {
                    break;
                }
            }
            *i >= *rows
        }
    }

    fn parts(self: Box<Self>, workers: usize) -> Option<CpuParts> {
        let boxed = |part: Box<dyn CpuPart>| part;
        let Self {
            a,
            b,
            c,
            n,
            k,
            rows,
            cols,
            ..
        } = *self;
        disjoint(CpuParts {
            parts: split(rows, cols * k, workers)
                .into_iter()
                .map(|range| {
                    let output = c + 4 * range.start * n..c + 4 * range.end * n;
                    let part = MatmulPart {
                        gemm: Gemm::<T>::new(range.len(), cols, k, n),
                        row0: range.start,
                        k,
                        n,
                    };
                    (output, boxed(Box::new(part)))
                })
                .collect(),
            inputs: vec![a..a + 4 * rows * k, b..b + 4 * k * n],
        })
    }
}

/// Rows `row0..` of a matmul.
struct MatmulPart<T> {
    gemm: Gemm<T>,
    row0: usize,
    k: usize,
    n: usize,
}

impl<T: Element + Send> CpuPart for MatmulPart<T> {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        let [a, b] = inputs else {
            return Err(internal("matmul"));
        };
        let source = Matrices {
            a: &a[4 * self.row0 * self.k..],
            b,
            k: self.k,
            ldb: self.n,
        };
        Ok(self.gemm.step(&source, output, GEMM_STEP))
    }
}
