//! JSON arguments and results of a component's typed exports, converted by the export's WIT
//! types (`wasmtime::component::Type`), with errors that name where a value does not fit.
//!
//! | WIT | JSON |
//! |---|---|
//! | `bool` | `true` / `false` |
//! | `s8` … `u32`, `s64`, `u64` | a number (64-bit ones also as a decimal string) |
//! | `f32`, `f64` | a number |
//! | `char` | a string of one character |
//! | `string` | a string |
//! | `list<T>`, `tuple<…>` | an array |
//! | `record` | an object with exactly its fields |
//! | `variant` | `{"case": value}`, or `"case"` for a case without a payload |
//! | `enum` | the case's name |
//! | `option<T>` | `null` or the value |
//! | `result<T, E>` | `{"ok": value}` or `{"err": value}` (`null` value for no payload) |
//! | `flags` | an array of the names set |
//!
//! Resources, streams and futures cannot cross JSON and are refused.

use serde_json::{json, Map, Value as Json};
use wasmtime::component::{Type, Val};

/// Why a JSON value does not fit a WIT type: where (`args[1].point.x`) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch(pub String);

fn mismatch(at: &str, expected: &str, got: &Json) -> Mismatch {
    let got = match got {
        Json::Null => "null".to_owned(),
        Json::Bool(_) => "a boolean".to_owned(),
        Json::Number(n) => format!("the number {n}"),
        Json::String(_) => "a string".to_owned(),
        Json::Array(a) => format!("an array of {}", a.len()),
        Json::Object(_) => "an object".to_owned(),
    };
    Mismatch(format!("{at}: expected {expected}, got {got}"))
}

/// `value` as a value of `ty`; `at` names the place in errors.
pub fn to_val(value: &Json, ty: &Type, at: &str) -> Result<Val, Mismatch> {
    macro_rules! int {
        ($variant:ident, $t:ty, $name:literal) => {{
            let n = match value {
                Json::Number(n) => n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)),
                Json::String(s) => s.parse::<i128>().ok(),
                _ => None,
            };
            n.and_then(|n| <$t>::try_from(n).ok())
                .map(Val::$variant)
                .ok_or_else(|| mismatch(at, concat!("an integer of type ", $name), value))
        }};
    }
    match ty {
        Type::Bool => value
            .as_bool()
            .map(Val::Bool)
            .ok_or_else(|| mismatch(at, "a boolean", value)),
        Type::S8 => int!(S8, i8, "s8"),
        Type::U8 => int!(U8, u8, "u8"),
        Type::S16 => int!(S16, i16, "s16"),
        Type::U16 => int!(U16, u16, "u16"),
        Type::S32 => int!(S32, i32, "s32"),
        Type::U32 => int!(U32, u32, "u32"),
        Type::S64 => int!(S64, i64, "s64"),
        Type::U64 => int!(U64, u64, "u64"),
        Type::Float32 => value
            .as_f64()
            .map(|f| Val::Float32(f as f32))
            .ok_or_else(|| mismatch(at, "a number (f32)", value)),
        Type::Float64 => value
            .as_f64()
            .map(Val::Float64)
            .ok_or_else(|| mismatch(at, "a number (f64)", value)),
        Type::Char => {
            let mut chars = value.as_str().map(str::chars);
            match chars.as_mut().map(|c| (c.next(), c.next())) {
                Some((Some(c), None)) => Ok(Val::Char(c)),
                _ => Err(mismatch(at, "a string of one character", value)),
            }
        }
        Type::String => value
            .as_str()
            .map(|s| Val::String(s.to_owned()))
            .ok_or_else(|| mismatch(at, "a string", value)),
        Type::List(list) => {
            let items = value
                .as_array()
                .ok_or_else(|| mismatch(at, "an array", value))?;
            let ty = list.ty();
            items
                .iter()
                .enumerate()
                .map(|(i, item)| to_val(item, &ty, &format!("{at}[{i}]")))
                .collect::<Result<_, _>>()
                .map(Val::List)
        }
        Type::Tuple(tuple) => {
            let types: Vec<Type> = tuple.types().collect();
            let items = value
                .as_array()
                .filter(|a| a.len() == types.len())
                .ok_or_else(|| {
                    mismatch(at, &format!("an array of {} (a tuple)", types.len()), value)
                })?;
            items
                .iter()
                .zip(&types)
                .enumerate()
                .map(|(i, (item, ty))| to_val(item, ty, &format!("{at}[{i}]")))
                .collect::<Result<_, _>>()
                .map(Val::Tuple)
        }
        Type::Record(record) => {
            let object = value
                .as_object()
                .ok_or_else(|| mismatch(at, "an object (a record)", value))?;
            let fields: Vec<_> = record.fields().collect();
            if let Some(extra) = object
                .keys()
                .find(|k| !fields.iter().any(|f| f.name == k.as_str()))
            {
                return Err(Mismatch(format!("{at}: the record has no field `{extra}`")));
            }
            fields
                .iter()
                .map(|field| {
                    let place = format!("{at}.{}", field.name);
                    let value = object
                        .get(field.name)
                        .ok_or_else(|| Mismatch(format!("{place}: missing")))?;
                    Ok((field.name.to_owned(), to_val(value, &field.ty, &place)?))
                })
                .collect::<Result<_, _>>()
                .map(Val::Record)
        }
        Type::Variant(variant) => {
            let (name, payload) = case_of(value, at)?;
            let case = variant
                .cases()
                .find(|c| c.name == name)
                .ok_or_else(|| Mismatch(format!("{at}: the variant has no case `{name}`")))?;
            let payload = payload_of(case.ty.as_ref(), payload, &format!("{at}.{name}"))?;
            Ok(Val::Variant(name.to_owned(), payload))
        }
        Type::Enum(cases) => match value.as_str() {
            Some(name) if cases.names().any(|c| c == name) => Ok(Val::Enum(name.to_owned())),
            _ => Err(mismatch(
                at,
                &format!("one of {}", cases.names().collect::<Vec<_>>().join(", ")),
                value,
            )),
        },
        Type::Option(option) => match value {
            Json::Null => Ok(Val::Option(None)),
            some => Ok(Val::Option(Some(Box::new(to_val(some, &option.ty(), at)?)))),
        },
        Type::Result(result) => {
            let (name, payload) = case_of(value, at)?;
            match name {
                "ok" => Ok(Val::Result(Ok(payload_of(
                    result.ok().as_ref(),
                    payload,
                    &format!("{at}.ok"),
                )?))),
                "err" => Ok(Val::Result(Err(payload_of(
                    result.err().as_ref(),
                    payload,
                    &format!("{at}.err"),
                )?))),
                _ => Err(Mismatch(format!(
                    "{at}: a result is {{\"ok\": …}} or {{\"err\": …}}"
                ))),
            }
        }
        Type::Flags(flags) => {
            let names = value
                .as_array()
                .ok_or_else(|| mismatch(at, "an array of flag names", value))?;
            names
                .iter()
                .map(|n| match n.as_str() {
                    Some(n) if flags.names().any(|f| f == n) => Ok(n.to_owned()),
                    _ => Err(mismatch(
                        at,
                        &format!(
                            "names among {}",
                            flags.names().collect::<Vec<_>>().join(", ")
                        ),
                        n,
                    )),
                })
                .collect::<Result<_, _>>()
                .map(Val::Flags)
        }
        _ => Err(Mismatch(format!(
            "{at}: this export takes a resource, stream, future or map, which JSON cannot carry"
        ))),
    }
}

/// The case name and payload of `{"case": payload}` or `"case"`.
fn case_of<'a>(value: &'a Json, at: &str) -> Result<(&'a str, Option<&'a Json>), Mismatch> {
    match value {
        Json::String(name) => Ok((name, None)),
        Json::Object(object) if object.len() == 1 => {
            let (name, payload) = object.iter().next().expect("one entry");
            Ok((name, Some(payload)))
        }
        other => Err(mismatch(at, "{\"case\": value} or \"case\"", other)),
    }
}

fn payload_of(
    ty: Option<&Type>,
    payload: Option<&Json>,
    at: &str,
) -> Result<Option<Box<Val>>, Mismatch> {
    match (ty, payload) {
        (None, None | Some(Json::Null)) => Ok(None),
        (None, Some(other)) => Err(mismatch(at, "no payload (null)", other)),
        (Some(ty), Some(payload)) => Ok(Some(Box::new(to_val(payload, ty, at)?))),
        (Some(_), None) => Err(Mismatch(format!("{at}: missing its payload"))),
    }
}

/// `val` as JSON (the inverse of [`to_val`]; 64-bit integers stay numbers).
pub fn to_json(val: &Val) -> Json {
    let boxed = |v: &Option<Box<Val>>| v.as_deref().map_or(Json::Null, to_json);
    match val {
        Val::Bool(b) => json!(b),
        Val::S8(n) => json!(n),
        Val::U8(n) => json!(n),
        Val::S16(n) => json!(n),
        Val::U16(n) => json!(n),
        Val::S32(n) => json!(n),
        Val::U32(n) => json!(n),
        Val::S64(n) => json!(n),
        Val::U64(n) => json!(n),
        Val::Float32(f) => json!(f),
        Val::Float64(f) => json!(f),
        Val::Char(c) => json!(c.to_string()),
        Val::String(s) => json!(s),
        Val::List(items) | Val::Tuple(items) | Val::FixedLengthList(items) => {
            Json::Array(items.iter().map(to_json).collect())
        }
        Val::Record(fields) => Json::Object(
            fields
                .iter()
                .map(|(name, v)| (name.clone(), to_json(v)))
                .collect::<Map<_, _>>(),
        ),
        Val::Variant(name, None) | Val::Enum(name) => json!(name),
        Val::Variant(name, payload) => json!({ name.clone(): boxed(payload) }),
        Val::Option(v) => boxed(v),
        Val::Result(Ok(v)) => json!({ "ok": boxed(v) }),
        Val::Result(Err(v)) => json!({ "err": boxed(v) }),
        Val::Flags(names) => json!(names),
        Val::Map(_) | Val::Resource(_) | Val::Future(_) | Val::Stream(_) | Val::ErrorContext(_) => {
            Json::Null
        }
    }
}
