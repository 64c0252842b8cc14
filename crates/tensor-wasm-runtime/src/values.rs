//! Conversion between JSON values and typed wasm values for export calls.
//!
//! Rules (documented in the README and the OpenAPI spec):
//! - `i32`: a JSON integer in `-2^31 ..= 2^32-1` (unsigned values keep their bits);
//! - `i64`: a JSON integer in `-2^63 ..= 2^64-1`, or the same as a decimal string
//!   of at most [`MAX_DECIMAL_CHARS`] characters (clients whose numbers are
//!   doubles cannot carry 64 bits);
//! - `f32` / `f64`: a JSON number, or `"NaN"`, `"Infinity"`, `"-Infinity"`.
//!
//! Results come back as JSON numbers, with non-finite floats as those strings.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use wasmtime::{FuncType, Val, ValType};

use crate::error::{Result, RuntimeError};

/// Longest decimal string an `i64` argument may be (sign and leading zeros
/// included): 64 bits need 20 digits, and a longer string is refused before
/// it is parsed or kept (a job stores its arguments).
pub const MAX_DECIMAL_CHARS: usize = 40;

/// Longest piece of an argument quoted back in an error message.
const QUOTED_ARG_CHARS: usize = 64;

/// A value type an export may take or return through the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WasmType {
    I32,
    I64,
    F32,
    F64,
    /// Any other type (`v128`, references): such exports cannot be called over HTTP.
    Unsupported,
}

impl From<&ValType> for WasmType {
    fn from(ty: &ValType) -> Self {
        match ty {
            ValType::I32 => WasmType::I32,
            ValType::I64 => WasmType::I64,
            ValType::F32 => WasmType::F32,
            ValType::F64 => WasmType::F64,
            _ => WasmType::Unsupported,
        }
    }
}

/// Name and signature of an exported function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportSignature {
    pub name: String,
    pub params: Vec<WasmType>,
    pub results: Vec<WasmType>,
}

impl ExportSignature {
    pub(crate) fn new(name: &str, ty: &FuncType) -> Self {
        ExportSignature {
            name: name.to_owned(),
            params: ty.params().map(|t| WasmType::from(&t)).collect(),
            results: ty.results().map(|t| WasmType::from(&t)).collect(),
        }
    }
}

/// Converts JSON arguments to wasm values of the export's parameter types.
pub fn args_from_json(export: &str, ty: &FuncType, args: &[Json]) -> Result<Vec<Val>> {
    if ty.params().len() != args.len() {
        return Err(RuntimeError::InvalidArguments(format!(
            "export `{export}` takes {} argument(s), got {}",
            ty.params().len(),
            args.len()
        )));
    }
    ty.params()
        .zip(args)
        .enumerate()
        .map(|(i, (param, arg))| {
            value_from_json(&param, arg).ok_or_else(|| {
                RuntimeError::InvalidArguments(format!(
                    "argument {i} of `{export}` must be {}, got {}",
                    describe(&param),
                    quoted(arg)
                ))
            })
        })
        .collect()
}

/// `arg` as JSON, cut to [`QUOTED_ARG_CHARS`] characters.
fn quoted(arg: &Json) -> String {
    let text = arg.to_string();
    match text.char_indices().nth(QUOTED_ARG_CHARS) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text,
    }
}

fn describe(ty: &ValType) -> &'static str {
    match ty {
        ValType::I32 => "an i32 (integer in -2147483648..=4294967295)",
        ValType::I64 => "an i64 (integer, or decimal string of at most 40 characters, in 64 bits)",
        ValType::F32 => "an f32 (number, \"NaN\", \"Infinity\" or \"-Infinity\")",
        ValType::F64 => "an f64 (number, \"NaN\", \"Infinity\" or \"-Infinity\")",
        _ => "a type the HTTP API cannot pass (v128 or reference)",
    }
}

fn integer_bits(arg: &Json, min: i128, max: i128) -> Option<i128> {
    let n = match arg {
        Json::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))?,
        Json::String(s) if s.len() <= MAX_DECIMAL_CHARS => s.parse::<i128>().ok()?,
        _ => return None,
    };
    (min..=max).contains(&n).then_some(n)
}

fn float_value(arg: &Json) -> Option<f64> {
    match arg {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

fn value_from_json(ty: &ValType, arg: &Json) -> Option<Val> {
    match ty {
        // i32 takes numbers only: strings are the escape hatch for 64-bit values.
        ValType::I32 if arg.is_number() => {
            let n = integer_bits(arg, i32::MIN.into(), u32::MAX.into())?;
            Some(Val::I32(n as u32 as i32))
        }
        ValType::I64 => {
            let n = integer_bits(arg, i64::MIN.into(), u64::MAX.into())?;
            Some(Val::I64(n as u64 as i64))
        }
        ValType::F32 => float_value(arg).map(|f| Val::F32((f as f32).to_bits())),
        ValType::F64 => float_value(arg).map(|f| Val::F64(f.to_bits())),
        _ => None,
    }
}

fn float_to_json(f: f64) -> Json {
    if f.is_nan() {
        Json::from("NaN")
    } else if f.is_infinite() {
        Json::from(if f > 0.0 { "Infinity" } else { "-Infinity" })
    } else {
        Json::from(f)
    }
}

/// Converts wasm results to JSON.
pub fn results_to_json(results: &[Val]) -> Vec<Json> {
    results
        .iter()
        .map(|v| match v {
            Val::I32(i) => Json::from(*i),
            Val::I64(i) => Json::from(*i),
            Val::F32(bits) => float_to_json(f64::from(f32::from_bits(*bits))),
            Val::F64(bits) => float_to_json(f64::from_bits(*bits)),
            other => Json::String(format!("unsupported result {other:?}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasmtime::Engine;

    fn ty(params: &[ValType]) -> FuncType {
        FuncType::new(&Engine::default(), params.iter().cloned(), [])
    }

    #[test]
    fn integers_are_range_checked() {
        let t = ty(&[ValType::I32]);
        assert!(matches!(
            args_from_json("f", &t, &[json!(4294967295u64)]).unwrap()[0],
            Val::I32(-1)
        ));
        assert!(args_from_json("f", &t, &[json!(4294967296u64)]).is_err());
        assert!(args_from_json("f", &t, &[json!(-2147483649i64)]).is_err());
        assert!(args_from_json("f", &t, &[json!(1.5)]).is_err());
        assert!(args_from_json("f", &t, &[json!("7")]).is_err());
        assert!(args_from_json("f", &t, &[json!(true)]).is_err());
    }

    #[test]
    fn i64_accepts_decimal_strings_for_full_width() {
        let t = ty(&[ValType::I64]);
        let v = args_from_json("f", &t, &[json!("18446744073709551615")]).unwrap();
        assert!(matches!(v[0], Val::I64(-1)));
        let v = args_from_json("f", &t, &[json!(i64::MIN)]).unwrap();
        assert!(matches!(v[0], Val::I64(i64::MIN)));
        assert!(args_from_json("f", &t, &[json!("18446744073709551616")]).is_err());
    }

    #[test]
    fn decimal_strings_are_bounded_before_they_are_parsed() {
        let t = ty(&[ValType::I64]);
        let at_bound = format!("{}7", "0".repeat(MAX_DECIMAL_CHARS - 1));
        let v = args_from_json("f", &t, &[json!(at_bound)]).unwrap();
        assert!(matches!(v[0], Val::I64(7)));
        // Leading zeros keep the value in range: only the length refuses it.
        let long = format!("{}7", "0".repeat(MAX_DECIMAL_CHARS));
        let err = args_from_json("f", &t, &[json!(long)]).unwrap_err();
        assert!(err.to_string().contains("at most 40 characters"), "{err}");
        let huge = "1".repeat(1 << 20);
        let err = args_from_json("f", &t, &[json!(huge)]).unwrap_err();
        assert!(
            err.to_string().len() < 400,
            "the argument is not echoed whole"
        );
    }

    #[test]
    fn arity_is_checked() {
        let t = ty(&[ValType::I32, ValType::I32]);
        let err = args_from_json("add", &t, &[json!(1)]).unwrap_err();
        assert!(err.to_string().contains("takes 2 argument(s), got 1"));
    }

    #[test]
    fn floats_round_trip_including_non_finite() {
        let t = ty(&[ValType::F64, ValType::F32]);
        let v = args_from_json("f", &t, &[json!("NaN"), json!(2.5)]).unwrap();
        let out = results_to_json(&v);
        assert_eq!(out, vec![json!("NaN"), json!(2.5)]);
        assert_eq!(
            results_to_json(&[Val::F64(f64::NEG_INFINITY.to_bits())]),
            vec![json!("-Infinity")]
        );
    }
}
