//! Matrix multiply on the CPU near the core's peak, with the GPU kernels' exact arithmetic.
//!
//! Every output is `c[i][j] = ((0 + a[i][0]·b[0][j]) + a[i][1]·b[1][j]) + ...` in order of the
//! inner index `p`, each product and each sum rounded on its own (never fused), as the PTX
//! matmul and conv2d kernels compute it. That order is per output, so it leaves the freedom that
//! makes a matrix multiply fast: outputs are independent. [`Gemm`] computes a *register tile* of
//! `MR × NR` outputs at once — each step of `p` broadcasts `MR` values of `a` and multiplies them
//! with `NR` consecutive values of `b`, one vector instruction per row and operation — from
//! operands *packed* into the order the tile reads them, in blocks sized for the caches:
//!
//! - b is packed per `NC` columns, all of its `k` rows, in panels of `NR` columns (a `KC × NR`
//!   slice of a panel stays in L1 while the tiles of a block use it);
//! - a is packed per block of `MC` rows and `KC` of `p`, in panels of `MR` rows (in L2);
//! - a block's running sums stay in an `MC × NC` array across its `KC` slices of `p`, so slicing
//!   `p` does not reorder any sum (a sum is stored as an f32 between slices: exact).
//!
//! Compiled three times, chosen at run time ([`Isa`]): for the baseline target with tiles `NR` =
//! 8 columns wide (one 8-lane vector), for AVX-512 with tiles 16 wide (one 16-lane vector), and
//! for AVX2 with the same 16-wide tiles computed 6 rows at a time (two 8-lane vectors a row);
//! `TENSOR_WASM_CPU_ISA` picks a narrower one (tests, comparisons). None uses FMA: `a + b * c`
//! stays two rounded operations, so every width gives the same bits.
//!
//! A [`Gemm`] is computed in bounded steps ([`Gemm::step`]) so that the CPU backend can stop it
//! between steps (a cancelled launch) and serve other tenants in between.

use std::fmt;

#[path = "gemm_packed.rs"]
mod packed;
pub use packed::PackedA;

/// Rows of a register tile (one broadcast value of `a` each).
const MR: usize = 12;
/// Columns of a register tile of the baseline build.
const NR_NARROW: usize = 8;
/// Columns of a register tile of the AVX-512 and AVX2 builds.
const NR_WIDE: usize = 16;
/// Values of `p` in one packed block of `a`.
const KC: usize = 256;
/// A multiply of at most this many rows runs without packing ([`Blocked::step_direct`]):
/// packing b would cost as much as the product. (At 16 rows the register tiles win by 2x
/// even with packing, in the transformer of `make models-bench`.)
const DIRECT_ROWS: usize = 4;
/// Columns of a strip of a multiply of few rows ([`Blocked::step_direct`]).
const STRIP: usize = 16;
/// Rows of a direct strip computed at once by [`Lane::strip_avx512`]: enough independent sums
/// to hide the latency of each add.
const STRIP_ROWS: usize = 8;
/// Rows of `a` in one packed block (a multiple of `MR`).
const MC: usize = 96;
/// Columns of `b` packed at a time (a multiple of every `NR`).
const NC: usize = 512;
/// Most bytes of packed b one multiply keeps. Packed b holds every `p` of a column block so
/// that all row blocks share it; a narrow b (fewer than `NR` columns) is padded to `NR`, so
/// a long, narrow b would take up to 16 × its own size. Past this cap only the slice of `p`
/// in use is packed, again for every row block: memory stays bounded whatever the guest's
/// shape, at the price of packing b once per row block.
const PACKED_B_CAP: usize = 32 << 20;

/// An element type a [`Gemm`] multiplies: the GPU's 32-bit arithmetic (`f32` rounded to
/// nearest, `i32` wrapping), stored little-endian in guest memory.
pub trait Lane: Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The additive identity every sum starts from.
    const ZERO: Self;
    /// The value of 4 little-endian bytes.
    fn from_le(bytes: [u8; 4]) -> Self;
    /// The 4 little-endian bytes of the value.
    fn to_le(self) -> [u8; 4];
    /// `self + other` as the GPU computes it.
    fn add(self, other: Self) -> Self;
    /// `self * other` as the GPU computes it.
    fn mul(self, other: Self) -> Self;
    /// One column of register tiles `R` rows by 16 with AVX-512 vectors, as [`register_tile`]
    /// computes each (`tile_column`'s operands, panels of `R` rows: [`MR`], or 16 for
    /// [`PackedA`]). Written with intrinsics: left to itself, the compiler vectorises the
    /// generic tile across rows, with gathers.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    unsafe fn tile_column_avx512<const R: usize>(
        kc: usize,
        packed_a: &[Self],
        panel: &[Self],
        ldb: usize,
        fresh: bool,
        sums: &mut [Self],
    );

    /// [`STRIP_ROWS`] rows of a direct strip ([`Blocked::step_direct`]) with AVX-512
    /// vectors: `sums[i][j] = a[i][p] · b[p][j]` summed in order of `p` from zero, a product
    /// then a sum, each rounded, as every tile. `b` is `(values, ldb, width)`: row `p` of the
    /// strip is `values[p * ldb..][..width]` (`width` at most 16; the other sums are zero).
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    unsafe fn strip_avx512(
        a: [&[Self]; STRIP_ROWS],
        b: (&[Self], usize, usize),
        sums: &mut [[Self; STRIP]; STRIP_ROWS],
    );

    /// [`Lane::tile_column_avx512`]'s 16-wide tiles with AVX2's 8-lane vectors: each tile in
    /// two halves of 6 rows × 2 vectors, so that the 12 sums, two vectors of `b` and the
    /// broadcast `a` fit the 16 registers.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[doc(hidden)]
    unsafe fn tile_column_avx2(
        kc: usize,
        packed_a: &[Self],
        panel: &[Self],
        ldb: usize,
        fresh: bool,
        sums: &mut [Self],
    );
}

impl Lane for f32 {
    const ZERO: Self = 0.0;
    fn from_le(bytes: [u8; 4]) -> Self {
        f32::from_le_bytes(bytes)
    }
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }
    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        self * other
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile_column_avx512<const R: usize>(
        kc: usize,
        packed_a: &[Self],
        panel: &[Self],
        ldb: usize,
        fresh: bool,
        sums: &mut [Self],
    ) {
        // SAFETY: the caller guarantees AVX-512F, the function's one requirement.
        unsafe { avx512::tile_column_f32::<R>(kc, packed_a, panel, ldb, fresh, sums) }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile_column_avx2(
        kc: usize,
        packed_a: &[Self],
        panel: &[Self],
        ldb: usize,
        fresh: bool,
        sums: &mut [Self],
    ) {
        // SAFETY: the caller guarantees AVX2, the function's one requirement.
        unsafe { avx2::tile_column_f32(kc, packed_a, panel, ldb, fresh, sums) }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn strip_avx512(
        a: [&[Self]; STRIP_ROWS],
        b: (&[Self], usize, usize),
        sums: &mut [[Self; STRIP]; STRIP_ROWS],
    ) {
        // SAFETY: the caller guarantees AVX-512F, the function's one requirement.
        unsafe { avx512::strip_f32(a, b, sums) }
    }
}

impl Lane for i32 {
    const ZERO: Self = 0;
    fn from_le(bytes: [u8; 4]) -> Self {
        i32::from_le_bytes(bytes)
    }
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        self.wrapping_mul(other)
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile_column_avx512<const R: usize>(
        kc: usize,
        packed_a: &[Self],
        panel: &[Self],
        ldb: usize,
        fresh: bool,
        sums: &mut [Self],
    ) {
        // SAFETY: the caller guarantees AVX-512F, the function's one requirement.
        unsafe { avx512::tile_column_i32::<R>(kc, packed_a, panel, ldb, fresh, sums) }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile_column_avx2(
        kc: usize,
        packed_a: &[Self],
        panel: &[Self],
        ldb: usize,
        fresh: bool,
        sums: &mut [Self],
    ) {
        // SAFETY: the caller guarantees AVX2, the function's one requirement.
        unsafe { avx2::tile_column_i32(kc, packed_a, panel, ldb, fresh, sums) }
    }
    #[cfg(target_arch = "x86_64")]
    unsafe fn strip_avx512(
        a: [&[Self]; STRIP_ROWS],
        b: (&[Self], usize, usize),
        sums: &mut [[Self; STRIP]; STRIP_ROWS],
    ) {
        // SAFETY: the caller guarantees AVX-512F, the function's one requirement.
        unsafe { avx512::strip_i32(a, b, sums) }
    }
}

/// Fills `into` with the little-endian values at the start of `bytes`.
pub fn decode_into<T: Lane>(bytes: &[u8], into: &mut [T]) {
    for (value, chunk) in into.iter_mut().zip(bytes.chunks_exact(4)) {
        *value = T::from_le([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
}

/// Writes `values` little-endian at the start of `bytes`.
pub fn encode_into<T: Lane>(values: &[T], bytes: &mut [u8]) {
    for (chunk, value) in bytes.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&value.to_le());
    }
}

/// Where a [`Gemm`] reads its operands: `a` is `m × k`, `b` is `k × cols` (at least).
pub trait GemmSource<T> {
    /// Fills `out` with `a[row][p0..p0 + out.len()]`.
    fn a_row(&self, row: usize, p0: usize, out: &mut [T]);
    /// Fills `out` with `b[p][col0..col0 + out.len()]`.
    fn b_row(&self, p: usize, col0: usize, out: &mut [T]);
    /// a's values as they lie, when they can be read in place: row `i` at
    /// `values[i * lda..][..k]`, as `(values, lda)`. `None` (the default) has the multiply
    /// copy the rows it reads.
    fn a_in_place(&self) -> Option<(&[T], usize)> {
        None
    }
    /// b's values in place likewise: row `p` at `values[p * ldb..][..cols]`.
    fn b_in_place(&self) -> Option<(&[T], usize)> {
        None
    }
}

/// Row-major `a` (`k` values per row) and `b` (`ldb` values per row) as little-endian bytes,
/// each slice starting at element `[0][0]`.
#[derive(Clone, Copy, Debug)]
pub struct Matrices<'a> {
    /// The bytes of `a`.
    pub a: &'a [u8],
    /// The bytes of `b`.
    pub b: &'a [u8],
    /// Values per row of `a`.
    pub k: usize,
    /// Values per row of `b`.
    pub ldb: usize,
}

impl<T: Lane> GemmSource<T> for Matrices<'_> {
    fn a_row(&self, row: usize, p0: usize, out: &mut [T]) {
        decode_into(&self.a[4 * (row * self.k + p0)..], out);
    }
    fn b_row(&self, p: usize, col0: usize, out: &mut [T]) {
        decode_into(&self.b[4 * (p * self.ldb + col0)..], out);
    }
}

/// The vector instructions a [`Gemm`]'s register tiles are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// The baseline target (SSE2 on x86-64): tiles 8 columns wide.
    Portable,
    /// AVX2: 8-lane vectors, tiles 16 columns wide computed 6 rows at a time.
    Avx2,
    /// AVX-512 (F): 16-lane vectors, tiles 16 columns wide.
    Avx512,
}

impl Isa {
    /// Every ISA, narrowest first.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// Its name: `portable`, `avx2`, `avx512`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU runs it.
    #[must_use]
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest this CPU runs.
    #[must_use]
    pub fn detected() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.is_available())
            .unwrap_or(Isa::Portable)
    }

    /// What [`Gemm::new`] uses: [`Isa::detected`], or a narrower one named by the
    /// environment variable `TENSOR_WASM_CPU_ISA` (`portable`, `avx2`, `avx512`; one this CPU
    /// lacks, or an unknown name, is ignored with a warning). Read once per process.
    #[must_use]
    pub fn selected() -> Isa {
        static SELECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *SELECTED.get_or_init(|| {
            let detected = Isa::detected();
            let Ok(asked) = std::env::var("TENSOR_WASM_CPU_ISA") else {
                return detected;
            };
            match Isa::ALL.into_iter().find(|isa| isa.name() == asked.trim()) {
                Some(isa) if isa.is_available() => isa,
                _ => {
                    tracing::warn!(
                        asked = %asked,
                        using = detected.name(),
                        "TENSOR_WASM_CPU_ISA names no ISA this CPU has; ignored"
                    );
                    detected
                }
            }
        })
    }
}

/// `c = a · b` for rows `0..m` and columns `0..cols` of `c`, computed in bounded steps.
///
/// `c` is written as little-endian bytes, `ldc` values per row, one finished block of `MC` rows
/// by `NC` columns at a time; nothing else of `c` is touched.
pub struct Gemm<T>(Width<T>);

/// A [`Gemm`] with tiles of one width.
enum Width<T> {
    Narrow(Blocked<T, NR_NARROW>),
    Wide(Blocked<T, NR_WIDE>),
}

impl<T> fmt::Debug for Gemm<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Width::Narrow(g) => g.fmt(f),
            Width::Wide(g) => g.fmt(f),
        }
    }
}

impl<T: Lane> Gemm<T> {
    /// A multiply of `m` rows and `cols` columns over `k` values of `p`; `c` has `ldc >= cols`
    /// values per row. Its tiles use [`Isa::selected`].
    #[must_use]
    pub fn new(m: usize, cols: usize, k: usize, ldc: usize) -> Self {
        Self::with_isa(Isa::selected(), m, cols, k, ldc)
    }

    /// [`Gemm::new`] with tiles for `isa` (every ISA gives the same bits).
    ///
    /// # Panics
    /// When this CPU lacks `isa` ([`Isa::is_available`]).
    #[must_use]
    pub fn with_isa(isa: Isa, m: usize, cols: usize, k: usize, ldc: usize) -> Self {
        assert!(isa.is_available(), "this CPU lacks {}", isa.name());
        Self(match isa {
            Isa::Avx512 | Isa::Avx2 => Width::Wide(Blocked::new(isa, m, cols, k, ldc)),
            Isa::Portable => Width::Narrow(Blocked::new(isa, m, cols, k, ldc)),
        })
    }

    /// Makes this a new multiply (as [`Gemm::new`] with the same ISA), keeping its buffers:
    /// many small products in a row (a batch of matrices) then allocate nothing.
    pub fn restart(&mut self, m: usize, cols: usize, k: usize, ldc: usize) {
        match &mut self.0 {
            Width::Narrow(g) => g.restart(m, cols, k, ldc),
            Width::Wide(g) => g.restart(m, cols, k, ldc),
        }
    }

    /// The ISA of its tiles.
    #[must_use]
    pub fn isa(&self) -> Isa {
        match &self.0 {
            Width::Narrow(g) => g.isa,
            Width::Wide(g) => g.isa,
        }
    }

    /// The same multiply with packed b capped at `bytes` (tests: both packing modes).
    #[cfg(test)]
    pub(crate) fn with_packed_b_cap(mut self, bytes: usize) -> Self {
        match &mut self.0 {
            Width::Narrow(g) => g.packed_b_cap = bytes,
            Width::Wide(g) => g.packed_b_cap = bytes,
        }
        self
    }

    /// Values of packed b held now, and the tiles' width (tests).
    #[cfg(test)]
    pub(crate) fn packed_b(&self) -> (usize, usize) {
        match &self.0 {
            Width::Narrow(g) => (g.packed_b.len(), NR_NARROW),
            Width::Wide(g) => (g.packed_b.len(), NR_WIDE),
        }
    }

    /// Whether every output is computed and written.
    #[must_use]
    pub fn done(&self) -> bool {
        match &self.0 {
            Width::Narrow(g) => g.done(),
            Width::Wide(g) => g.done(),
        }
    }

    /// Computes at least one packing or panel and about `work` multiply-adds (packing counts
    /// one per value), from `source` into `c`; `true` once the whole product is written. The
    /// operands must not change between steps of one product (the CPU backend's launches
    /// guarantee it: no other writer runs meanwhile).
    ///
    /// # Panics
    /// When `source` or `c` is too short for the shape given to [`Gemm::new`].
    pub fn step(&mut self, source: &impl GemmSource<T>, c: &mut [u8], work: usize) -> bool {
        match &mut self.0 {
            Width::Narrow(g) => g.step(source, c, work),
            Width::Wide(g) => g.step(source, c, work),
        }
    }
}

/// The blocked multiply for tiles `NR` columns wide (see [`Gemm`]).
struct Blocked<T, const NR: usize> {
    /// The vector instructions of this build's register tiles (available on this CPU).
    isa: Isa,
    m: usize,
    cols: usize,
    k: usize,
    ldc: usize,
    /// The block in progress: columns from `jc`, rows from `ic`, `p` from `pc`, and the next
    /// panel of `NR` columns within it.
    jc: usize,
    ic: usize,
    pc: usize,
    jr: usize,
    /// Whether the operands of block (`jc`, `ic`, `pc`) are packed.
    packed: bool,
    /// b's columns `jc..jc + NC`, every `p` (or only `pc..pc + KC` past the cap): panel `jr`
    /// holds `[p][NR]` at `jr * depth * NR`, `depth` being `k` (or `KC`).
    packed_b: Vec<T>,
    /// Bytes packed b may take before only the slice in use is kept.
    packed_b_cap: usize,
    /// a's rows `ic..ic + MC`, `p` in `pc..pc + KC`: panel `ir` holds `[p][MR]`.
    packed_a: Vec<T>,
    /// The block's running sums, tile by tile: tile (`ir`, `jr`) at
    /// `(jr * m_tiles + ir) * MR * NR`, row-major inside, `m_tiles` being the block's row
    /// panels (`mc / MR` rounded up).
    sums: Vec<T>,
    /// One row of an operand or of the output on its way.
    row: Vec<T>,
}

impl<T, const NR: usize> fmt::Debug for Blocked<T, NR> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gemm")
            .field("isa", &self.isa)
            .field("m", &self.m)
            .field("cols", &self.cols)
            .field("k", &self.k)
            .field("at", &(self.jc, self.ic, self.pc, self.jr))
            .finish_non_exhaustive()
    }
}

impl<T: Lane, const NR: usize> Blocked<T, NR> {
    fn new(isa: Isa, m: usize, cols: usize, k: usize, ldc: usize) -> Self {
        Self {
            isa,
            m,
            cols,
            k,
            ldc,
            jc: 0,
            ic: 0,
            pc: 0,
            jr: 0,
            packed: false,
            packed_b: Vec::new(),
            packed_b_cap: PACKED_B_CAP,
            packed_a: Vec::new(),
            sums: Vec::new(),
            row: Vec::new(),
        }
    }

    fn restart(&mut self, m: usize, cols: usize, k: usize, ldc: usize) {
        (self.m, self.cols, self.k, self.ldc) = (m, cols, k, ldc);
        (self.jc, self.ic, self.pc, self.jr) = (0, 0, 0, 0);
        self.packed = false;
    }

    /// Whether packed b holds every `p` of a column block `nc` wide (else only a slice).
    fn packs_all_of_b(&self, nc: usize) -> bool {
        self.k
            .saturating_mul(nc.next_multiple_of(NR))
            .saturating_mul(std::mem::size_of::<T>())
            <= self.packed_b_cap
    }

    fn done(&self) -> bool {
        self.m == 0 || self.cols == 0 || self.jc >= self.cols
    }

    fn step(&mut self, source: &impl GemmSource<T>, c: &mut [u8], work: usize) -> bool {
        // A few columns by many rows: a strip of 16 with many rows at once (AVX-512) beats
        // packing both operands for tiles whose columns b fills only partly.
        let strips = self.isa == Isa::Avx512 && NR == STRIP && self.cols <= STRIP;
        // The direct path holds b whole, its rows padded to strips: within the cap.
        let fits = self
            .k
            .saturating_mul(self.cols.next_multiple_of(STRIP))
            .saturating_mul(std::mem::size_of::<T>())
            <= self.packed_b_cap;
        if (self.m <= DIRECT_ROWS || strips) && fits {
            return self.step_direct(source, c, work);
        }
        let mut spent = 0usize;
        while !self.done() {
            let nc = NC.min(self.cols - self.jc);
            let mc = MC.min(self.m - self.ic);
            let kc = KC.min(self.k - self.pc);
            let m_tiles = mc.div_ceil(MR);
            let all_of_b = self.packs_all_of_b(nc);
            if self.jr == 0 && !self.packed {
                // The block's operands: b's rows of this slice of `p` once per column block
                // (with the first row block; every time past the cap), a's block every time.
                if self.ic == 0 || !all_of_b {
                    self.pack_b(source, nc, kc, all_of_b);
                    spent += kc * nc;
                }
                if self.pc == 0 {
                    // No need to clear: the first slice of `p` writes every tile afresh.
                    let len = m_tiles * MR * nc.next_multiple_of(NR);
                    if self.sums.len() < len {
                        self.sums.resize(len, T::ZERO);
                    }
                }
                self.pack_a(source, mc, kc);
                self.packed = true;
                spent += (mc * kc).max(1);
                if spent >= work {
                    break;
                }
            }
            let panel = if all_of_b {
                (self.jr * self.k + self.pc) * NR
            } else {
                self.jr * kc * NR
            };
            let panel = &self.packed_b[panel..][..kc * NR];
            let sums = &mut self.sums[self.jr * m_tiles * MR * NR..][..m_tiles * MR * NR];
            tile_column::<T, NR>(
                self.isa,
                kc,
                &self.packed_a[..m_tiles * kc * MR],
                panel,
                NR,
                self.pc == 0,
                sums,
            );
            spent += (m_tiles * MR * NR * kc).max(1);
            self.jr += 1;
            if self.jr * NR >= nc {
                self.jr = 0;
                self.packed = false;
                self.pc += KC;
                if self.pc >= self.k {
                    self.pc = 0;
                    self.store(c, mc, nc);
                    self.ic += MC;
                    if self.ic >= self.m {
                        self.ic = 0;
                        self.jc += NC;
                    }
                }
            }
            if spent >= work {
                break;
            }
        }
        self.done()
    }

    /// Packs b's columns `jc..jc + nc` for `p` in `pc..pc + kc` into panels of `NR` (zeros
    /// past `nc`). With `all_of_b` the panels hold every `p`, allocated at the column block's
    /// first slice; otherwise they hold this slice alone.
    fn pack_b(&mut self, source: &impl GemmSource<T>, nc: usize, kc: usize, all_of_b: bool) {
        let panels = nc.div_ceil(NR);
        let (depth, first) = if all_of_b { (self.k, self.pc) } else { (kc, 0) };
        if self.pc == 0 || !all_of_b {
            self.packed_b.clear();
            self.packed_b.resize(panels * depth * NR, T::ZERO);
        }
        self.row.resize(self.row.len().max(panels * NR), T::ZERO);
        self.row[nc..panels * NR].fill(T::ZERO);
        for p in 0..kc {
            source.b_row(self.pc + p, self.jc, &mut self.row[..nc]);
            for (jr, values) in self.row[..panels * NR].chunks_exact(NR).enumerate() {
                self.packed_b[(jr * depth + first + p) * NR..][..NR].copy_from_slice(values);
            }
        }
    }

    /// Packs a's rows `ic..ic + mc`, `p` in `pc..pc + kc`, into panels of `MR` (zero rows past
    /// `mc`).
    fn pack_a(&mut self, source: &impl GemmSource<T>, mc: usize, kc: usize) {
        let panels = mc.div_ceil(MR);
        self.packed_a.clear();
        self.packed_a.resize(panels * kc * MR, T::ZERO);
        self.row.resize(self.row.len().max(kc), T::ZERO);
        if kc == 0 {
            return;
        }
        for r in 0..mc {
            source.a_row(self.ic + r, self.pc, &mut self.row[..kc]);
            let panel = &mut self.packed_a[(r / MR) * kc * MR..][..kc * MR];
            for (slot, &value) in panel[r % MR..].iter_mut().step_by(MR).zip(&self.row) {
                *slot = value;
            }
        }
    }

    /// Writes the finished block's `mc × nc` outputs into `c`.
    fn store(&mut self, c: &mut [u8], mc: usize, nc: usize) {
        let m_tiles = mc.div_ceil(MR);
        for r in 0..mc {
            let (ir, within) = (r / MR, r % MR);
            let at = 4 * ((self.ic + r) * self.ldc + self.jc);
            let out = &mut c[at..at + 4 * nc];
            // Straight from each tile's row into `c`, NR values at a time.
            for (jr, out) in out.chunks_mut(4 * NR).enumerate() {
                let tile = (jr * m_tiles + ir) * MR * NR;
                encode_into(&self.sums[tile + within * NR..][..NR], out);
            }
        }
    }
}

/// Adds `kc` steps of `p` to the tiles of one column of panels: `packed_a` holds the block's
/// row panels (`[p][MR]` each), `panel` b's `NR` columns, row `p` at `p * ldb` (`ldb >= NR`;
/// `NR` for a packed panel), `sums` the column's tiles in row order.
fn tile_column<T: Lane, const NR: usize>(
    isa: Isa,
    kc: usize,
    packed_a: &[T],
    panel: &[T],
    ldb: usize,
    fresh: bool,
    sums: &mut [T],
) {
    if kc == 0 {
        if fresh {
            sums.fill(T::ZERO);
        }
        return;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Blocked` is only made with an ISA this CPU has (`Gemm::with_isa` checks),
        // the one requirement of `tile_column_avx512`. Its tiles are 16 wide, as this
        // `Blocked`'s are (`Gemm::with_isa` makes AVX-512 ones with `NR_WIDE`).
        Isa::Avx512 if NR == NR_WIDE => unsafe {
            T::tile_column_avx512::<MR>(kc, packed_a, panel, ldb, fresh, sums);
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 (whose tiles are 16 wide too).
        Isa::Avx2 if NR == NR_WIDE => unsafe {
            T::tile_column_avx2(kc, packed_a, panel, ldb, fresh, sums);
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2, the one requirement of a `#[target_feature]` function;
        // the function is safe code.
        Isa::Avx2 => unsafe { tile_column_avx2::<T, NR>(kc, packed_a, panel, ldb, fresh, sums) },
        _ => tile_column_portable::<T, NR>(kc, packed_a, panel, ldb, fresh, sums),
    }
}

/// The direct path of few rows or few columns (`gemm_direct.rs`).
#[path = "gemm_direct.rs"]
mod direct;

/// The intrinsic tiles of the AVX-512 and AVX2 builds (`gemm_x86.rs`).
#[cfg(target_arch = "x86_64")]
#[path = "gemm_x86.rs"]
mod x86;
#[cfg(target_arch = "x86_64")]
use x86::{avx2, avx512};

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn tile_column_avx2<T: Lane, const NR: usize>(
    kc: usize,
    packed_a: &[T],
    panel: &[T],
    ldb: usize,
    fresh: bool,
    sums: &mut [T],
) {
    tile_column_portable::<T, NR>(kc, packed_a, panel, ldb, fresh, sums);
}

#[inline(always)]
fn tile_column_portable<T: Lane, const NR: usize>(
    kc: usize,
    packed_a: &[T],
    panel: &[T],
    ldb: usize,
    fresh: bool,
    sums: &mut [T],
) {
    if kc == 0 {
        return;
    }
    for (a_panel, tile) in packed_a
        .chunks_exact(kc * MR)
        .zip(sums.chunks_exact_mut(MR * NR))
    {
        register_tile::<T, NR>(a_panel, panel, ldb, fresh, tile);
    }
}

/// One register tile: `tile[r][j] = tile[r][j] + a[p][r] * b[p][j]` for each `p` in order. The
/// sums live in a local array the compiler keeps in vector registers.
#[inline(always)]
fn register_tile<T: Lane, const NR: usize>(
    a_panel: &[T],
    b_panel: &[T],
    ldb: usize,
    fresh: bool,
    tile: &mut [T],
) {
    let mut acc = [[T::ZERO; NR]; MR];
    if !fresh {
        for (row, sums) in acc.iter_mut().zip(tile.chunks_exact(NR)) {
            row.copy_from_slice(sums);
        }
    }
    for (a, b) in a_panel.chunks_exact(MR).zip(b_panel.chunks(ldb)) {
        let (Ok(a), Ok(b)) = (<&[T; MR]>::try_from(a), <&[T; NR]>::try_from(&b[..NR])) else {
            continue;
        };
        for (row, &a_value) in acc.iter_mut().zip(a) {
            for (sum, &b_value) in row.iter_mut().zip(b) {
                *sum = sum.add(a_value.mul(b_value));
            }
        }
    }
    for (row, sums) in acc.iter().zip(tile.chunks_exact_mut(NR)) {
        sums.copy_from_slice(row);
    }
}

#[cfg(test)]
#[path = "gemm_tests.rs"]
mod tests;
