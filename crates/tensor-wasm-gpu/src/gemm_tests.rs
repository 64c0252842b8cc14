//! Tests of `Gemm`: every output equals the kernels' definition (`acc = acc + a * b` from zero, in
//! order), bit for bit, at any shape, step size and value, with the tiles of every ISA this CPU
//! has (portable and AVX2 on every x86-64 host that has AVX2, AVX-512 where the CPU has it).

use proptest::prelude::*;

use super::*;

/// The kernels' definition, one output at a time: `acc = acc + a * b` from zero in order of `p`.
fn reference<T: Lane>(a: &[T], b: &[T], (m, cols, k, ldb): (usize, usize, usize, usize)) -> Vec<T> {
    let mut c = Vec::with_capacity(m * cols);
    for i in 0..m {
        for j in 0..cols {
            let mut acc = T::ZERO;
            for p in 0..k {
                acc = acc.add(a[i * k + p].mul(b[p * ldb + j]));
            }
            c.push(acc);
        }
    }
    c
}

fn bytes<T: Lane>(values: &[T]) -> Vec<u8> {
    let mut out = vec![0u8; 4 * values.len()];
    encode_into(values, &mut out);
    out
}

/// The ISAs this CPU has, narrowest first.
fn isas() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|isa| isa.is_available())
        .collect()
}

/// [`run_with`] for every ISA this CPU has; panics unless all give the same bytes.
fn run<T: Lane>(
    a: &[T],
    b: &[T],
    shape: (usize, usize, usize, usize),
    ldc: usize,
    work: usize,
) -> Vec<u8> {
    let mut results = isas()
        .into_iter()
        .map(|isa| (isa, run_with(isa, a, b, shape, ldc, work)));
    let (_, first) = results.next().expect("the portable build");
    // f32: NaN payloads may differ between widths (as between CPU and GPU); all else exact.
    let is_f32 = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>();
    for (isa, other) in results {
        let same = if is_f32 {
            same_f32(&other, &first)
        } else {
            other == first
        };
        assert!(same, "{} differs from portable at {shape:?}", isa.name());
    }
    first
}

/// Runs a `Gemm` with `isa`'s tiles in steps of `work` over row-major operands (odd `work`:
/// with packed b capped to the slice in use); `c` starts filled with 0xA5 bytes so that
/// untouched values show. Returns c's `m × ldc` values as bits-comparable bytes.
fn run_with<T: Lane>(
    isa: Isa,
    a: &[T],
    b: &[T],
    (m, cols, k, ldb): (usize, usize, usize, usize),
    ldc: usize,
    work: usize,
) -> Vec<u8> {
    let (a, b) = (bytes(a), bytes(b));
    let source = Matrices {
        a: &a,
        b: &b,
        k,
        ldb,
    };
    let mut c = vec![0xA5u8; 4 * m * ldc];
    // Odd step sizes also pack only the slice of b in use (a cap below any packed b here).
    let mut gemm = Gemm::<T>::with_isa(isa, m, cols, k, ldc);
    assert_eq!(gemm.isa(), isa);
    if work % 2 == 1 {
        gemm = gemm.with_packed_b_cap(0);
    }
    let mut steps = 0;
    while !gemm.step(&source, &mut c, work) {
        steps += 1;
        assert!(steps < 1 << 24, "a gemm that never ends");
    }
    assert!(gemm.done() && gemm.step(&source, &mut c, work));
    c
}

/// The expected bytes: the reference's outputs in columns `0..cols`, fill bytes elsewhere.
fn expected<T: Lane>(a: &[T], b: &[T], shape: (usize, usize, usize, usize), ldc: usize) -> Vec<u8> {
    let (m, cols, _, _) = shape;
    let values = reference(a, b, shape);
    let mut c = vec![0xA5u8; 4 * m * ldc];
    for i in 0..m {
        encode_into(&values[i * cols..][..cols], &mut c[4 * i * ldc..]);
    }
    c
}

/// f32 bytes compared with every NaN taken as one value (CPU and GPU differ in NaN payloads,
/// and so may two CPU instruction orders).
fn same_f32(left: &[u8], right: &[u8]) -> bool {
    left.len() == right.len()
        && left
            .chunks_exact(4)
            .zip(right.chunks_exact(4))
            .all(|(l, r)| {
                let (l, r) = (
                    f32::from_le_bytes(l.try_into().unwrap()),
                    f32::from_le_bytes(r.try_into().unwrap()),
                );
                l.to_bits() == r.to_bits() || (l.is_nan() && r.is_nan())
            })
}

/// Values whose products and sums round, overflow, underflow to denormals and make NaNs.
fn hard_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -4.0f32..4.0,
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::NAN),
        1 => Just(-0.0f32),
        1 => (1u32..0x0080_0000).prop_map(f32::from_bits),
        1 => Just(f32::MAX),
        1 => Just(1.0e-20f32),
    ]
}

fn shapes() -> impl Strategy<Value = (usize, usize, usize, usize, usize, usize)> {
    // m, cols, k, extra columns of b, extra columns of c, step work.
    (
        1usize..40,
        1usize..40,
        0usize..40,
        0usize..3,
        0usize..3,
        1usize..5000,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn f32_products_equal_the_kernels_order_at_any_step_size(
        (m, cols, k, xb, xc, work) in shapes(),
        seed in proptest::collection::vec(hard_f32(), 64..65),
    ) {
        let ldb = cols + xb;
        let a: Vec<f32> = (0..m * k).map(|i| seed[(i * 7 + 3) % 64] * (1.0 + i as f32 / 64.0)).collect();
        let b: Vec<f32> = (0..k * ldb).map(|i| seed[(i * 5 + 1) % 64] - i as f32 / 128.0).collect();
        let shape = (m, cols, k, ldb);
        let got = run(&a, &b, shape, cols + xc, work);
        prop_assert!(same_f32(&got, &expected(&a, &b, shape, cols + xc)));
    }

    #[test]
    fn i32_products_wrap_like_the_kernels(
        (m, cols, k, xb, xc, work) in shapes(),
        seed in any::<u64>(),
    ) {
        let ldb = cols + xb;
        let value = |i: usize| (seed.rotate_left(i as u32 % 64) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) as i32;
        let a: Vec<i32> = (0..m * k).map(value).collect();
        let b: Vec<i32> = (0..k * ldb).map(|i| value(i + 1000)).collect();
        let shape = (m, cols, k, ldb);
        prop_assert_eq!(run(&a, &b, shape, cols + xc, work), expected(&a, &b, shape, cols + xc));
    }
}

/// `n` values of a made-up a: small integers over 7, both signs.
fn values_a(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect()
}

/// `n` values of a made-up b: small integers over 3, both signs.
fn values_b(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 3.0)
        .collect()
}

/// Shapes past every block edge (`MC`, `NC`, `KC`), in one step and in panel-sized steps.
#[test]
fn block_edges_keep_the_order() {
    for &(m, cols, k) in &[
        (MC + 1, NC + NR_WIDE + 3, KC + 5),
        (2 * MC, NC, 2 * KC),
        (MR - 1, NR_NARROW - 1, 1),
        (MR + 1, NR_WIDE - 1, 3),
        (MR, NR_NARROW + 1, 2),
    ] {
        let a = values_a(m * k);
        let b = values_b(k * cols);
        let shape = (m, cols, k, cols);
        let want = expected(&a, &b, shape, cols);
        assert!(
            same_f32(&run(&a, &b, shape, cols, usize::MAX), &want),
            "{shape:?} in one step"
        );
        assert!(
            same_f32(&run(&a, &b, shape, cols, 1), &want),
            "{shape:?} panel by panel"
        );
    }
}

/// `k = 0`: every covered output is the empty sum, zero.
#[test]
fn an_empty_sum_is_zero() {
    let got = run::<f32>(&[], &[], (3, 5, 0, 5), 6, 1);
    assert!(same_f32(&got, &expected::<f32>(&[], &[], (3, 5, 0, 5), 6)));
    assert_eq!(f32::from_le_bytes(got[..4].try_into().unwrap()), 0.0);
}

/// The sums are not fused: `a * b + c` rounds the product first.
#[test]
fn products_are_rounded_before_they_are_added() {
    let e = f32::EPSILON;
    // One row of a = [-1, 1 + e]; b = [[1], [1 - e]]: (0 + -1) + (1+e)(1-e) = 0 once the
    // product rounds to 1; a fused multiply-add would give -e².
    let got = run(
        &[-1.0, 1.0 + e],
        &[1.0, 1.0 - e],
        (1, 1, 2, 1),
        1,
        usize::MAX,
    );
    assert_eq!(f32::from_le_bytes(got[..4].try_into().unwrap()), 0.0);
}

/// A long, narrow b (one column) is not packed whole past the cap, which would pad it to a
/// tile's width (16 times its size): packed b stays one slice, and the product is still exact,
/// with the tiles of every ISA. (More rows than the direct path takes, which packs nothing;
/// the cap lowered so that `k` can stay small.)
#[test]
fn a_long_narrow_b_is_packed_a_slice_at_a_time() {
    let (m, k) = (DIRECT_ROWS + 1, 1 << 12);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..k).map(|i| (i % 7) as f32 * 0.5).collect();
    let (a_bytes, b_bytes) = (bytes(&a), bytes(&b));
    let source = Matrices {
        a: &a_bytes,
        b: &b_bytes,
        k,
        ldb: 1,
    };
    let cap = 4 * KC * NR_WIDE;
    assert!(4 * k * NR_NARROW > cap, "b would be packed whole");
    for isa in isas() {
        let mut c = vec![0u8; 4 * m];
        let mut gemm = Gemm::<f32>::with_isa(isa, m, 1, k, 1).with_packed_b_cap(cap);
        let (mut largest, mut nr) = (0, 0);
        while !gemm.step(&source, &mut c, 1) {
            let (held, width) = gemm.packed_b();
            (largest, nr) = (largest.max(held), width);
        }
        assert!(
            nr > 0 && largest <= KC * nr,
            "{}: packed b held {largest} values",
            isa.name()
        );
        assert!(
            same_f32(&c, &expected(&a, &b, (m, 1, k, 1), 1)),
            "{}",
            isa.name()
        );
    }
}

/// A multiply of few rows takes the direct path (b's rows as they are, one strip of columns
/// per step) and one of more rows the blocked one (panels of b), each with the reference's
/// bits.
#[test]
fn few_rows_multiply_without_packing() {
    for m in [1, DIRECT_ROWS, DIRECT_ROWS + 1] {
        let (cols, k) = (40, 300);
        let a = values_a(m * k);
        let b = values_b(k * cols);
        let (a_bytes, b_bytes) = (bytes(&a), bytes(&b));
        let source = Matrices {
            a: &a_bytes,
            b: &b_bytes,
            k,
            ldb: cols,
        };
        let mut c = vec![0u8; 4 * m * cols];
        let mut gemm = Gemm::<f32>::new(m, cols, k, cols);
        let mut steps = 1;
        while !gemm.step(&source, &mut c, 64) {
            steps += 1;
        }
        // The blocked path takes a step per panel of b and its packing, more than the strips.
        assert_eq!(
            steps == cols.div_ceil(STRIP),
            m <= DIRECT_ROWS,
            "{m} rows: {steps} steps"
        );
        assert!(
            same_f32(&c, &expected(&a, &b, (m, cols, k, cols), cols)),
            "{m} rows"
        );
    }
}

/// Many rows by at most 16 columns take the direct path too with AVX-512 (8 rows at a time,
/// the last group short), in one step, with the reference's bits on every ISA.
#[test]
fn many_rows_of_few_columns_multiply_by_strips() {
    let (m, cols, k) = (2 * STRIP_ROWS + 3, 10, 300);
    let a = values_a(m * k);
    let b = values_b(k * cols);
    let (a_bytes, b_bytes) = (bytes(&a), bytes(&b));
    let source = Matrices {
        a: &a_bytes,
        b: &b_bytes,
        k,
        ldb: cols,
    };
    for isa in isas() {
        let mut c = vec![0u8; 4 * m * cols];
        let mut gemm = Gemm::<f32>::with_isa(isa, m, cols, k, cols);
        let mut steps = 1;
        while !gemm.step(&source, &mut c, 64) {
            steps += 1;
        }
        assert_eq!(
            steps == 1,
            isa == Isa::Avx512,
            "{}: {steps} steps",
            isa.name()
        );
        assert!(
            same_f32(&c, &expected(&a, &b, (m, cols, k, cols), cols)),
            "{}",
            isa.name()
        );
    }
}

/// Operands a source offers in place (`GemmSource::a_in_place`, `b_in_place`) are read as
/// they lie, b's rows as long as its columns, with the bits of the copies.
#[test]
fn operands_in_place_give_the_copies_bits() {
    struct InPlace<'a> {
        a: &'a [f32],
        b: &'a [f32],
        k: usize,
        ldb: usize,
    }
    impl GemmSource<f32> for InPlace<'_> {
        fn a_row(&self, row: usize, p0: usize, out: &mut [f32]) {
            out.copy_from_slice(&self.a[row * self.k + p0..][..out.len()]);
        }
        fn b_row(&self, p: usize, col0: usize, out: &mut [f32]) {
            out.copy_from_slice(&self.b[p * self.ldb + col0..][..out.len()]);
        }
        fn a_in_place(&self) -> Option<(&[f32], usize)> {
            Some((self.a, self.k))
        }
        fn b_in_place(&self) -> Option<(&[f32], usize)> {
            Some((self.b, self.ldb))
        }
    }
    for (m, cols, k) in [
        (2 * STRIP_ROWS + 3, 10, 300),
        (DIRECT_ROWS + 1, 1, 7),
        (9, 16, 5),
    ] {
        let a = values_a(m * k);
        let b = values_b(k * cols);
        let source = InPlace {
            a: &a,
            b: &b,
            k,
            ldb: cols,
        };
        for isa in isas() {
            let mut c = vec![0u8; 4 * m * cols];
            let mut gemm = Gemm::<f32>::with_isa(isa, m, cols, k, cols);
            while !gemm.step(&source, &mut c, 64) {}
            assert!(
                same_f32(&c, &expected(&a, &b, (m, cols, k, cols), cols)),
                "{}: {m} × {cols} × {k}",
                isa.name()
            );
        }
    }
}

/// `PackedA` of any height (panels of 12 rows, or of 16 with AVX-512 where that wastes fewer)
/// multiplies a panel of b with the reference's bits, for all its rows and for a range of them.
#[test]
fn packed_a_of_any_height_gives_the_references_bits() {
    for (m, k) in [(5, 7), (12, 300), (16, 9), (20, 144), (32, 144), (33, 260)] {
        let a = values_a(m * k);
        let packed = PackedA::new(m, k, |i, out| out.copy_from_slice(&a[i * k..][..k]));
        // 16 and 32 rows are panels of 16 with AVX-512 (row 12 in the first), else of 12.
        let wide = Isa::selected() == Isa::Avx512 && m % 16 == 0;
        assert_eq!(packed.tile_start(12), if wide { 0 } else { 12 }, "{m} rows");
        let width = packed.width();
        let ldb = width + 3;
        let b = values_b(k * ldb);
        let want = expected(&a, &b, (m, width, k, ldb), width);
        for rows in [0..m, m / 3..m - m / 4] {
            let mut sums = Vec::new();
            packed.panel(rows.clone(), &b, ldb, &mut sums);
            let first = packed.tile_start(rows.start);
            let got = bytes(&sums[(rows.start - first) * width..][..rows.len() * width]);
            assert!(
                same_f32(&got, &want[4 * rows.start * width..4 * rows.end * width]),
                "{m} × {k}, rows {rows:?}"
            );
        }
    }
}

/// The ISA `Gemm::new` uses is the widest this CPU has unless `TENSOR_WASM_CPU_ISA` narrows
/// it (not set in the tests), and each ISA gives tiles of its width.
#[test]
fn the_widest_isa_is_selected_and_each_has_its_width() {
    if std::env::var_os("TENSOR_WASM_CPU_ISA").is_none() {
        assert_eq!(Isa::selected(), Isa::detected());
    }
    assert_eq!(Gemm::<f32>::new(1, 1, 1, 1).isa(), Isa::selected());
    for isa in isas() {
        let width = Gemm::<i32>::with_isa(isa, 1, 1, 1, 1).packed_b().1;
        assert_eq!(
            width,
            if isa == Isa::Portable {
                NR_NARROW
            } else {
                NR_WIDE
            }
        );
    }
    assert!(Isa::Portable.is_available());
}
