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
use wasmtime::component::{types::ComponentFunc, Type, Val};

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

/// Longest WIT text shown for one export's type; a longer one is cut and ends in `…`.
pub const MAX_WIT_CHARS: usize = 4096;

/// A typed export of a component as `GET /functions/{id}` lists it: its name and its
/// function type in WIT.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TypedExport {
    pub name: String,
    pub wit: String,
}

/// The WIT text of `func`, e.g. `func(p: record { x: f64, y: f64 }) -> f64`. Records,
/// variants, enums and flags are written out in place rather than by name: their JSON form
/// follows their structure. Text past [`MAX_WIT_CHARS`] is cut (a type shared by many
/// fields would otherwise be written out once per use).
pub fn func_wit(func: &ComponentFunc) -> String {
    let mut wit = WitText(String::new());
    let complete = wit.func(func).is_ok();
    let mut text = wit.0;
    if !complete {
        let cut = text.floor_char_boundary(MAX_WIT_CHARS);
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// WIT text under construction; `Err(Full)` once it is longer than [`MAX_WIT_CHARS`].
struct WitText(String);

struct Full;

impl WitText {
    fn push(&mut self, s: &str) -> Result<(), Full> {
        self.0.push_str(s);
        if self.0.len() > MAX_WIT_CHARS {
            Err(Full)
        } else {
            Ok(())
        }
    }

    /// `items` separated by `, `, each written by `item`.
    fn list<T>(
        &mut self,
        items: impl Iterator<Item = T>,
        mut item: impl FnMut(&mut Self, T) -> Result<(), Full>,
    ) -> Result<(), Full> {
        for (i, it) in items.enumerate() {
            if i > 0 {
                self.push(", ")?;
            }
            item(self, it)?;
        }
        Ok(())
    }

    fn func(&mut self, func: &ComponentFunc) -> Result<(), Full> {
        self.push("func(")?;
        self.list(func.params(), |w, (name, ty)| {
            w.push(name)?;
            w.push(": ")?;
            w.ty(&ty)
        })?;
        self.push(")")?;
        let results: Vec<Type> = func.results().collect();
        match results.as_slice() {
            [] => Ok(()),
            [one] => {
                self.push(" -> ")?;
                self.ty(one)
            }
            many => {
                self.push(" -> (")?;
                self.list(many.iter(), |w, ty| w.ty(ty))?;
                self.push(")")
            }
        }
    }

    /// `ty` within `<…>`, or nothing when absent.
    fn generic(&mut self, name: &str, ty: Option<Type>) -> Result<(), Full> {
        self.push(name)?;
        if let Some(ty) = ty {
            self.push("<")?;
            self.ty(&ty)?;
            self.push(">")?;
        }
        Ok(())
    }

    fn ty(&mut self, ty: &Type) -> Result<(), Full> {
        match ty {
            Type::Bool => self.push("bool"),
            Type::S8 => self.push("s8"),
            Type::U8 => self.push("u8"),
            Type::S16 => self.push("s16"),
            Type::U16 => self.push("u16"),
            Type::S32 => self.push("s32"),
            Type::U32 => self.push("u32"),
            Type::S64 => self.push("s64"),
            Type::U64 => self.push("u64"),
            Type::Float32 => self.push("f32"),
            Type::Float64 => self.push("f64"),
            Type::Char => self.push("char"),
            Type::String => self.push("string"),
            Type::List(list) => self.generic("list", Some(list.ty())),
            Type::FixedLengthList(list) => {
                self.push("list<")?;
                self.ty(&list.ty())?;
                self.push(&format!(", {}>", list.len()))
            }
            Type::Map(map) => {
                self.push("map<")?;
                self.ty(&map.key())?;
                self.push(", ")?;
                self.ty(&map.value())?;
                self.push(">")
            }
            Type::Tuple(tuple) => {
                self.push("tuple<")?;
                self.list(tuple.types(), |w, ty| w.ty(&ty))?;
                self.push(">")
            }
            Type::Record(record) => {
                self.push("record { ")?;
                self.list(record.fields(), |w, field| {
                    w.push(field.name)?;
                    w.push(": ")?;
                    w.ty(&field.ty)
                })?;
                self.push(" }")
            }
            Type::Variant(variant) => {
                self.push("variant { ")?;
                self.list(variant.cases(), |w, case| {
                    w.push(case.name)?;
                    if let Some(ty) = &case.ty {
                        w.push("(")?;
                        w.ty(ty)?;
                        w.push(")")?;
                    }
                    Ok(())
                })?;
                self.push(" }")
            }
            Type::Enum(cases) => {
                self.push("enum { ")?;
                self.list(cases.names(), |w, name| w.push(name))?;
                self.push(" }")
            }
            Type::Flags(flags) => {
                self.push("flags { ")?;
                self.list(flags.names(), |w, name| w.push(name))?;
                self.push(" }")
            }
            Type::Option(option) => self.generic("option", Some(option.ty())),
            Type::Result(result) => match (result.ok(), result.err()) {
                (None, None) => self.push("result"),
                (ok, None) => self.generic("result", ok),
                (ok, Some(err)) => {
                    self.push("result<")?;
                    match ok {
                        Some(ok) => self.ty(&ok)?,
                        None => self.push("_")?,
                    }
                    self.push(", ")?;
                    self.ty(&err)?;
                    self.push(">")
                }
            },
            Type::Own(_) => self.push("own<resource>"),
            Type::Borrow(_) => self.push("borrow<resource>"),
            Type::Future(future) => self.generic("future", future.ty()),
            Type::Stream(stream) => self.generic("stream", stream.ty()),
            Type::ErrorContext => self.push("error-context"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::component::{types::ComponentItem, Component};
    use wasmtime::Engine;

    /// The WIT text of each function component `wat` imports (a component that only imports
    /// needs no core module, and imported functions have the same types as exported ones).
    fn imported_wit(wat: &str) -> Vec<(String, String)> {
        let engine = Engine::default();
        let component = Component::new(&engine, wat).expect("component");
        component
            .component_type()
            .imports(&engine)
            .filter_map(|(name, item)| match item.ty {
                ComponentItem::ComponentFunc(func) => Some((name.to_owned(), func_wit(&func))),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn every_kind_of_type_is_written_in_wit() {
        let wit = imported_wit(
            r#"(component
                (type $point-def (record (field "x" f64) (field "y" f64)))
                (import "point" (type $point (eq $point-def)))
                (type $shape-def (variant (case "circle" f32) (case "empty")))
                (import "shape" (type $shape (eq $shape-def)))
                (type $mode-def (flags "read" "write"))
                (import "mode" (type $mode (eq $mode-def)))
                (type $color-def (enum "red" "green"))
                (import "color" (type $color (eq $color-def)))
                (import "handle" (type $handle (sub resource)))
                (import "everything" (func
                    (param "p" $point) (param "s" $shape) (param "m" $mode) (param "c" $color)
                    (param "pairs" (list (tuple u8 string))) (param "maybe" (option char))
                    (param "h" (borrow $handle))
                    (result (result (list s64) (error u16)))))
                (import "bare" (func (result (result))))
                (import "ok-only" (func (param "o" (own $handle)) (result (result bool))))
                (import "err-only" (func (result (result (error string)))))
                (import "nothing" (func))
                (import "numbers" (func (param "a" s8) (param "b" u16) (param "c" s32)
                    (param "d" u64) (param "e" bool) (result f32)))
            )"#,
        );
        let expected = [
            (
                "everything",
                "func(p: record { x: f64, y: f64 }, s: variant { circle(f32), empty }, \
                 m: flags { read, write }, c: enum { red, green }, pairs: list<tuple<u8, string>>, \
                 maybe: option<char>, h: borrow<resource>) -> result<list<s64>, u16>",
            ),
            ("bare", "func() -> result"),
            ("ok-only", "func(o: own<resource>) -> result<bool>"),
            ("err-only", "func() -> result<_, string>"),
            ("nothing", "func()"),
            (
                "numbers",
                "func(a: s8, b: u16, c: s32, d: u64, e: bool) -> f32",
            ),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(n, w)| (n.to_string(), w.to_string()))
            .collect();
        assert_eq!(wit, expected);
    }

    /// A record of eight records of eight … six levels deep is 8^6 fields written out: the
    /// text stops at the bound instead.
    #[test]
    fn a_type_too_long_to_write_out_is_cut() {
        let mut wat = String::from("(component\n");
        let fields = |ty: &str| {
            (0..8)
                .map(|i| format!("(field \"f{i}\" {ty})"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut inner = "u32".to_owned();
        for level in 0..6 {
            wat.push_str(&format!(
                "(type $r{level}-def (record {}))\n(import \"r{level}\" (type $r{level} (eq $r{level}-def)))\n",
                fields(&inner)
            ));
            inner = format!("$r{level}");
        }
        wat.push_str(&format!(
            "(import \"deep\" (func (param \"v\" {inner})))\n)"
        ));
        let wit = imported_wit(&wat);
        let (name, text) = &wit[0];
        assert_eq!(name, "deep");
        assert!(text.starts_with("func(v: record { f0: record { f0: record {"));
        assert!(text.ends_with('…'), "{}", &text[text.len() - 40..]);
        assert!(
            text.len() <= MAX_WIT_CHARS + '…'.len_utf8(),
            "{}",
            text.len()
        );
    }
}
