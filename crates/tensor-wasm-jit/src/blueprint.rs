//! The blueprint IR: typed kernel descriptions, their text descriptors, parser and validator.

use std::fmt;
use std::str::FromStr;

use crate::kinds::{parse_kind, with_kind, BlueprintKind, Kind, KIND_NAMES};
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

/// A validated kernel description: what to compute and on which element type.
///
/// # Descriptor grammar
///
/// Guests name kernels by a short ASCII text (at most [`MAX_DESCRIPTOR_LEN`] bytes, no spaces):
///
/// ```text
/// descriptor := kernel [ ":" dtype ]            dtype defaults to f32
/// dtype      := "f32" | "i32"
/// kernel     := NAME "[" PARAMS "]"             NAME one of KIND_NAMES; PARAMS as that
///                                               kind's parser reads them, e.g.
///                                               vector_add[4], matmul[16x16x16],
///                                               conv2d[3x3,s2,p1], softmax[axis]
/// int        := decimal digits without a leading zero, at most 4 of them
/// ```
///
/// Each kind of the catalogue ([`BlueprintKind`], [`crate::KIND_NAMES`]) parses its own
/// `PARAMS` and checks its own limits (matmul tiles at most 1024 threads and 48 KiB of shared
/// memory, conv2d filters 1..=11, f32-only functions, ...); docs/kernels.md lists every kind
/// with its parameters and numeric contract. The canonical form ([`fmt::Display`]) always
/// spells the dtype and every option: `conv2d[3x3]` is `conv2d[3x3,s1,p0]:f32`.
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
        with_kind!(kind, |k| k.check(dtype)).map_err(JitError::InvalidBlueprint)?;
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
        write!(f, "{}[", self.kind.name())?;
        with_kind!(&self.kind, |k| k.write_params(f))?;
        f.write_str("]")?;
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
    let Some(kind) = parse_kind(descriptor, name, params) else {
        return Err(JitError::parse(
            descriptor,
            format!("unknown kernel ({})", KIND_NAMES.join(", ")),
        ));
    };
    Blueprint::new(kind?, dtype)
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
            "elementwise[tanh]:i32",
            "elementwise[cosh]",
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
