//! The blueprint IR: typed kernel descriptions, their text descriptors, parser and validator.

use std::fmt;
use std::str::FromStr;

use crate::JitError;

/// Longest descriptor the parser reads, in bytes.
pub const MAX_DESCRIPTOR_LEN: usize = 64;

/// Element type of every buffer of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE-754 binary32; every operation rounds to nearest even, subnormals are kept.
    F32,
    /// Two's-complement 32-bit integers; arithmetic wraps.
    I32,
}

impl Dtype {
    /// The descriptor spelling: `f32` or `i32`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::I32 => "i32",
        }
    }
}

/// An element-wise operation: `out[i] = op(inputs[i]...)`.
///
/// `max(a, b)` is `a > b ? a : b` and `min(a, b)` is `a < b ? a : b` (so a NaN `a` gives `b`);
/// `relu(x)` is `x > 0 ? x : +0`. These are spelled out because the hardware `max` instruction
/// and Rust's `f32::max` leave signed zeros unspecified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementwiseOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (f32 only: integer division by zero has no portable result).
    Div,
    /// `a > b ? a : b`.
    Max,
    /// `a < b ? a : b`.
    Min,
    /// `x > 0 ? x : 0`.
    Relu,
    /// `alpha * x` with a scalar `alpha`.
    Scale,
    /// `a * b + c` with a single rounding (fused multiply-add; wrapping `a*b+c` for i32).
    Fma,
}

impl ElementwiseOp {
    /// Every operation, in descriptor order.
    pub const ALL: [ElementwiseOp; 9] = [
        ElementwiseOp::Add,
        ElementwiseOp::Sub,
        ElementwiseOp::Mul,
        ElementwiseOp::Div,
        ElementwiseOp::Max,
        ElementwiseOp::Min,
        ElementwiseOp::Relu,
        ElementwiseOp::Scale,
        ElementwiseOp::Fma,
    ];

    /// The descriptor spelling (`add`, `relu`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            ElementwiseOp::Add => "add",
            ElementwiseOp::Sub => "sub",
            ElementwiseOp::Mul => "mul",
            ElementwiseOp::Div => "div",
            ElementwiseOp::Max => "max",
            ElementwiseOp::Min => "min",
            ElementwiseOp::Relu => "relu",
            ElementwiseOp::Scale => "scale",
            ElementwiseOp::Fma => "fma",
        }
    }

    /// How many input buffers the operation reads (1 for `relu` and `scale`, 3 for `fma`).
    pub fn inputs(&self) -> usize {
        match self {
            ElementwiseOp::Relu | ElementwiseOp::Scale => 1,
            ElementwiseOp::Fma => 3,
            _ => 2,
        }
    }
}

/// The combining operation of a reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `acc + x`, starting from `+0`.
    Sum,
    /// `x > acc ? x : acc`, starting from `-inf` (f32) or `i32::MIN`; NaNs are skipped.
    Max,
}

impl ReduceOp {
    /// The descriptor spelling: `sum` or `max`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        }
    }
}

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

/// What a blueprint computes, without its element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlueprintKind {
    /// `elementwise[OP]`: one element per thread.
    Elementwise(ElementwiseOp),
    /// `vector_add[N]`: `out = a + b`, `lanes` consecutive elements per thread.
    VectorAdd {
        /// Elements per thread: 1, 2, 4, 8 or 16.
        lanes: u32,
    },
    /// `reduce[OP]`: one output per row of a rows × cols row-major matrix.
    Reduce(ReduceOp),
    /// `matmul[TMxTNxTK]`: C (m × n) = A (m × k) · B (k × n), row-major.
    Matmul(MatmulTile),
    /// `conv2d[RxS,sT,pP]`: NCHW input, KCRS weights, NKPQ output.
    Conv2d(Conv2dParams),
}

/// A validated kernel description: what to compute and on which element type.
///
/// # Descriptor grammar
///
/// Guests name kernels by a short ASCII text (at most [`MAX_DESCRIPTOR_LEN`] bytes, no spaces):
///
/// ```text
/// descriptor := kernel [ ":" dtype ]            dtype defaults to f32
/// dtype      := "f32" | "i32"
/// kernel     := "elementwise[" op "]"
///             | "vector_add[" lanes "]"          lanes := 1 | 2 | 4 | 8 | 16
///             | "reduce[" ( "sum" | "max" ) "]"
///             | "matmul[" int "x" int "x" int "]"              tile m x n x k
///             | "conv2d[" int "x" int [ ",s" int ] [ ",p" int ] "]"   filter r x s,
///                                                              stride (default 1),
///                                                              padding (default 0)
/// op         := "add" | "sub" | "mul" | "div" | "max" | "min" | "relu" | "scale" | "fma"
/// int        := decimal digits without a leading zero, at most 4 of them
/// ```
///
/// The canonical form ([`fmt::Display`]) always spells the dtype and, for `conv2d`, the stride
/// and padding: `conv2d[3x3]` is `conv2d[3x3,s1,p0]:f32`.
///
/// # Limits (checked by [`Blueprint::new`] and the parser)
/// - `elementwise[div]` is f32 only;
/// - matmul tiles: each side 1..=64, at most 1024 threads (`m * n`), shared memory
///   `4 * (m*k + k*n)` at most 48 KiB;
/// - conv2d: `r`, `s` in 1..=11, stride in 1..=8, padding below both `r` and `s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Blueprint {
    kind: BlueprintKind,
    dtype: Dtype,
}

/// Most threads in one block.
pub(crate) const MAX_THREADS: u32 = 1024;
/// Static shared memory a kernel may use, in bytes.
pub(crate) const MAX_SHARED: u32 = 48 * 1024;

impl Blueprint {
    /// A blueprint, if `kind` and `dtype` are within the limits above.
    ///
    /// # Errors
    /// [`JitError::InvalidBlueprint`] saying which limit is exceeded.
    pub fn new(kind: BlueprintKind, dtype: Dtype) -> Result<Self, JitError> {
        let invalid = |reason: String| Err(JitError::InvalidBlueprint(reason));
        match kind {
            BlueprintKind::Elementwise(ElementwiseOp::Div) if dtype == Dtype::I32 => {
                return invalid("elementwise[div] is only defined for f32".into());
            }
            BlueprintKind::VectorAdd { lanes } if !matches!(lanes, 1 | 2 | 4 | 8 | 16) => {
                return invalid(format!(
                    "vector_add lanes must be 1, 2, 4, 8 or 16, not {lanes}"
                ));
            }
            BlueprintKind::Matmul(tile) => {
                for (side, value) in [("m", tile.m), ("n", tile.n), ("k", tile.k)] {
                    if !(1..=64).contains(&value) {
                        return invalid(format!(
                            "matmul tile {side} must be in 1..=64, not {value}"
                        ));
                    }
                }
                if tile.m * tile.n > MAX_THREADS {
                    return invalid(format!(
                        "matmul tile {}x{} needs {} threads per block, more than {MAX_THREADS}",
                        tile.m,
                        tile.n,
                        tile.m * tile.n
                    ));
                }
                let shared = 4 * (tile.m * tile.k + tile.k * tile.n);
                if shared > MAX_SHARED {
                    return invalid(format!(
                        "matmul tile needs {shared} bytes of shared memory, more than {MAX_SHARED}"
                    ));
                }
            }
            BlueprintKind::Conv2d(params) => {
                for (what, value) in [("r", params.r), ("s", params.s)] {
                    if !(1..=11).contains(&value) {
                        return invalid(format!(
                            "conv2d filter {what} must be in 1..=11, not {value}"
                        ));
                    }
                }
                if !(1..=8).contains(&params.stride) {
                    return invalid(format!(
                        "conv2d stride must be in 1..=8, not {}",
                        params.stride
                    ));
                }
                if params.pad >= params.r.min(params.s) {
                    return invalid(format!(
                        "conv2d padding {} must be smaller than the filter ({}x{})",
                        params.pad, params.r, params.s
                    ));
                }
            }
            _ => {}
        }
        Ok(Self { kind, dtype })
    }

    /// Parses a descriptor (see the grammar above).
    ///
    /// # Errors
    /// [`JitError::Parse`] for text outside the grammar, [`JitError::InvalidBlueprint`] for
    /// parameters outside the limits.
    pub fn parse(descriptor: &str) -> Result<Self, JitError> {
        parse(descriptor)
    }

    /// What this blueprint computes.
    pub fn kind(&self) -> &BlueprintKind {
        &self.kind
    }

    /// The element type of its buffers.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The canonical descriptor, e.g. `matmul[16x16x16]:f32` (the same as `to_string()`).
    pub fn descriptor(&self) -> String {
        self.to_string()
    }

    /// The PTX entry name: the canonical descriptor with every non-alphanumeric run turned into
    /// one `_`, prefixed `tw_` (e.g. `tw_conv2d_3x3_s1_p0_f32`).
    pub fn entry_name(&self) -> String {
        let mut name = String::from("tw");
        let mut pending = true;
        for c in self.descriptor().chars() {
            if c.is_ascii_alphanumeric() {
                if pending {
                    name.push('_');
                    pending = false;
                }
                name.push(c);
            } else {
                pending = true;
            }
        }
        name
    }
}

impl fmt::Display for Blueprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            BlueprintKind::Elementwise(op) => write!(f, "elementwise[{}]", op.as_str())?,
            BlueprintKind::VectorAdd { lanes } => write!(f, "vector_add[{lanes}]")?,
            BlueprintKind::Reduce(op) => write!(f, "reduce[{}]", op.as_str())?,
            BlueprintKind::Matmul(t) => write!(f, "matmul[{}x{}x{}]", t.m, t.n, t.k)?,
            BlueprintKind::Conv2d(p) => {
                write!(f, "conv2d[{}x{},s{},p{}]", p.r, p.s, p.stride, p.pad)?
            }
        }
        write!(f, ":{}", self.dtype.as_str())
    }
}

impl FromStr for Blueprint {
    type Err = JitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

impl serde::Serialize for Blueprint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Blueprint {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        parse(&text).map_err(serde::de::Error::custom)
    }
}

fn parse(descriptor: &str) -> Result<Blueprint, JitError> {
    let fail = |reason: &str| Err(JitError::parse(descriptor, reason));
    if descriptor.len() > MAX_DESCRIPTOR_LEN {
        return fail("longer than 64 bytes");
    }
    if !descriptor.is_ascii() {
        return fail("not ASCII");
    }
    let (kernel, dtype) = match descriptor.split_once(':') {
        None => (descriptor, Dtype::F32),
        Some((kernel, "f32")) => (kernel, Dtype::F32),
        Some((kernel, "i32")) => (kernel, Dtype::I32),
        Some(_) => return fail("the data type after ':' must be f32 or i32"),
    };
    let Some((name, rest)) = kernel.split_once('[') else {
        return fail("expected NAME[PARAMS], e.g. vector_add[4]");
    };
    let Some(params) = rest.strip_suffix(']') else {
        return fail("parameters must end with ']'");
    };
    if params.contains(['[', ']']) {
        return fail("unbalanced brackets");
    }
    let kind = match name {
        "elementwise" => {
            let Some(op) = ElementwiseOp::ALL
                .into_iter()
                .find(|op| op.as_str() == params)
            else {
                return fail(
                    "unknown element-wise op (add, sub, mul, div, max, min, relu, scale, fma)",
                );
            };
            BlueprintKind::Elementwise(op)
        }
        "vector_add" => BlueprintKind::VectorAdd {
            lanes: parse_int(descriptor, params)?,
        },
        "reduce" => match params {
            "sum" => BlueprintKind::Reduce(ReduceOp::Sum),
            "max" => BlueprintKind::Reduce(ReduceOp::Max),
            _ => return fail("reduce takes sum or max"),
        },
        "matmul" => {
            let sides: Vec<&str> = params.split('x').collect();
            let [m, n, k] = sides[..] else {
                return fail("matmul takes a tile MxNxK, e.g. matmul[16x16x16]");
            };
            BlueprintKind::Matmul(MatmulTile {
                m: parse_int(descriptor, m)?,
                n: parse_int(descriptor, n)?,
                k: parse_int(descriptor, k)?,
            })
        }
        "conv2d" => BlueprintKind::Conv2d(parse_conv2d(descriptor, params)?),
        _ => return fail("unknown kernel (elementwise, vector_add, reduce, matmul, conv2d)"),
    };
    Blueprint::new(kind, dtype)
}

fn parse_conv2d(descriptor: &str, params: &str) -> Result<Conv2dParams, JitError> {
    let mut parts = params.split(',');
    let filter = parts.next().unwrap_or_default();
    let Some((r, s)) = filter.split_once('x') else {
        return Err(JitError::parse(
            descriptor,
            "conv2d takes a filter RxS, e.g. conv2d[3x3,s1,p1]",
        ));
    };
    let mut conv = Conv2dParams {
        r: parse_int(descriptor, r)?,
        s: parse_int(descriptor, s)?,
        stride: 1,
        pad: 0,
    };
    let mut next = parts.next();
    if let Some(stride) = next.and_then(|part| part.strip_prefix('s')) {
        conv.stride = parse_int(descriptor, stride)?;
        next = parts.next();
    }
    if let Some(pad) = next.and_then(|part| part.strip_prefix('p')) {
        conv.pad = parse_int(descriptor, pad)?;
        next = parts.next();
    }
    if next.is_some() {
        return Err(JitError::parse(
            descriptor,
            "conv2d options are ,sSTRIDE then ,pPADDING",
        ));
    }
    Ok(conv)
}

fn parse_int(descriptor: &str, text: &str) -> Result<u32, JitError> {
    let valid = !text.is_empty()
        && text.len() <= 4
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    if !valid {
        return Err(JitError::parse(
            descriptor,
            format!("{text:?} is not a number (1 to 4 digits, no leading zero)"),
        ));
    }
    text.parse()
        .map_err(|_| JitError::parse(descriptor, format!("{text:?} is not a number")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn descriptors_parse_to_their_canonical_form() {
        for (text, canonical) in [
            ("vector_add[4]:f32", "vector_add[4]:f32"),
            ("vector_add[16]", "vector_add[16]:f32"),
            ("elementwise[relu]:f32", "elementwise[relu]:f32"),
            ("elementwise[fma]:i32", "elementwise[fma]:i32"),
            ("reduce[sum]:i32", "reduce[sum]:i32"),
            ("reduce[max]", "reduce[max]:f32"),
            ("matmul[16x16x16]:f32", "matmul[16x16x16]:f32"),
            ("matmul[8x32x4]:i32", "matmul[8x32x4]:i32"),
            ("conv2d[3x3]", "conv2d[3x3,s1,p0]:f32"),
            ("conv2d[3x3,s2,p1]", "conv2d[3x3,s2,p1]:f32"),
            ("conv2d[3x3,s1,p1]:f32", "conv2d[3x3,s1,p1]:f32"),
            ("conv2d[5x3,p2]:i32", "conv2d[5x3,s1,p2]:i32"),
            ("conv2d[1x1,s2]", "conv2d[1x1,s2,p0]:f32"),
        ] {
            let blueprint = Blueprint::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(blueprint.descriptor(), canonical);
            assert_eq!(Blueprint::parse(canonical), Ok(blueprint));
        }
    }

    #[test]
    fn bad_descriptors_are_refused_with_a_reason() {
        for text in [
            "",
            "vector_add",
            "vector_add[3]",
            "vector_add[04]",
            "vector_add[4]:f64",
            "vector_add[4]:",
            "vector_add[4]]",
            "vector_add[[4]",
            "elementwise[tanh]",
            "elementwise[div]:i32",
            "reduce[min]",
            "matmul[16x16]",
            "matmul[0x16x16]",
            "matmul[64x64x16]",
            "matmul[16x16x65]",
            "matmul[16x16x-1]",
            "conv2d[3]",
            "conv2d[3x3,p1,s2]",
            "conv2d[3x3,s0]",
            "conv2d[3x3,p3]",
            "conv2d[12x3]",
            "conv2d[3x3,s1,p1,x]",
            "Matmul[16x16x16]",
            " vector_add[4]",
            "vector_add[ 4]",
            "vector_add[99999]",
        ] {
            let error = Blueprint::parse(text).expect_err(text);
            assert!(!error.to_string().is_empty());
        }
    }

    #[test]
    fn entry_names_are_ptx_identifiers() {
        let blueprint = Blueprint::parse("conv2d[3x3,s2,p1]:i32").unwrap();
        assert_eq!(blueprint.entry_name(), "tw_conv2d_3x3_s2_p1_i32");
        let blueprint = Blueprint::parse("elementwise[relu]").unwrap();
        assert_eq!(blueprint.entry_name(), "tw_elementwise_relu_f32");
    }

    #[test]
    fn serde_uses_the_descriptor() {
        let blueprint = Blueprint::parse("matmul[16x8x4]:i32").unwrap();
        let json = serde_json::to_string(&blueprint).unwrap();
        assert_eq!(json, "\"matmul[16x8x4]:i32\"");
        assert_eq!(serde_json::from_str::<Blueprint>(&json).unwrap(), blueprint);
        assert!(serde_json::from_str::<Blueprint>("\"matmul[x]\"").is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in ".{0,80}") {
            let _ = Blueprint::parse(&text);
        }

        #[test]
        fn near_miss_text_never_panics(
            text in "(elementwise|vector_add|reduce|matmul|conv2d)?\\[?[0-9xsp,a-z:\\[\\]-]{0,20}"
        ) {
            if let Ok(blueprint) = Blueprint::parse(&text) {
                prop_assert_eq!(Blueprint::parse(&blueprint.descriptor()), Ok(blueprint));
            }
        }

        #[test]
        fn valid_matmul_tiles_round_trip(m in 1u32..=64, n in 1u32..=64, k in 1u32..=64) {
            let text = format!("matmul[{m}x{n}x{k}]:i32");
            match Blueprint::parse(&text) {
                Ok(blueprint) => prop_assert_eq!(blueprint.descriptor(), text),
                Err(error) => {
                    prop_assert!(m * n > 1024, "{}", error);
                    prop_assert!(matches!(error, JitError::InvalidBlueprint(_)));
                }
            }
        }
    }
}
