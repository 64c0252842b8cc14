//! `TensorProto`: dims, element type and data, the data normalised to little-endian element
//! bytes whichever field carried it (`raw_data` or one of the typed repeated fields) and
//! checked to be exactly as long as the dims say.

use super::data_type::{self, element_bytes};
use super::wire::{fixed_run, peek_bytes, within, Cx, Fields, Varints};
use super::Tensor;
use crate::{OnnxError, Result};

// `TensorProto` field numbers.
const DIMS: u32 = 1;
const DATA_TYPE: u32 = 2;
const SEGMENT: u32 = 3;
const FLOAT_DATA: u32 = 4;
const INT32_DATA: u32 = 5;
const STRING_DATA: u32 = 6;
const INT64_DATA: u32 = 7;
const NAME: u32 = 8;
const RAW_DATA: u32 = 9;
const DOUBLE_DATA: u32 = 10;
const UINT64_DATA: u32 = 11;
const EXTERNAL_DATA: u32 = 13;
const DATA_LOCATION: u32 = 14;

/// `TensorProto.DataLocation`: the bytes live in the message.
const LOCATION_DEFAULT: i32 = 0;
/// `TensorProto.DataLocation`: the bytes live in another file.
const LOCATION_EXTERNAL: i32 = 1;

/// The field that carries a tensor's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    /// `raw_data`: already little-endian element bytes.
    Raw,
    /// `float_data`: 32-bit floats (`float`, and `complex64` as pairs).
    Float,
    /// `int32_data`: varints for every integer or float type of at most 4 bytes but
    /// `uint32`; the low bytes of each are the element.
    Int32,
    /// `int64_data`: varints for `int64`.
    Int64,
    /// `double_data`: 64-bit floats (`double`, and `complex128` as pairs).
    Double,
    /// `uint64_data`: varints for `uint32` and `uint64`.
    Uint64,
}

impl Carrier {
    fn of_field(field: u32) -> Option<Carrier> {
        Some(match field {
            RAW_DATA => Carrier::Raw,
            FLOAT_DATA => Carrier::Float,
            INT32_DATA => Carrier::Int32,
            INT64_DATA => Carrier::Int64,
            DOUBLE_DATA => Carrier::Double,
            UINT64_DATA => Carrier::Uint64,
            _ => return None,
        })
    }

    fn field(self) -> u32 {
        match self {
            Carrier::Raw => RAW_DATA,
            Carrier::Float => FLOAT_DATA,
            Carrier::Int32 => INT32_DATA,
            Carrier::Int64 => INT64_DATA,
            Carrier::Double => DOUBLE_DATA,
            Carrier::Uint64 => UINT64_DATA,
        }
    }

    fn field_name(self) -> &'static str {
        match self {
            Carrier::Raw => "raw_data",
            Carrier::Float => "float_data",
            Carrier::Int32 => "int32_data",
            Carrier::Int64 => "int64_data",
            Carrier::Double => "double_data",
            Carrier::Uint64 => "uint64_data",
        }
    }

    /// The typed field ONNX stores elements of type `t` in.
    fn typed_for(t: i32) -> Carrier {
        match t {
            data_type::FLOAT | data_type::COMPLEX64 => Carrier::Float,
            data_type::DOUBLE | data_type::COMPLEX128 => Carrier::Double,
            data_type::INT64 => Carrier::Int64,
            data_type::UINT32 | data_type::UINT64 => Carrier::Uint64,
            _ => Carrier::Int32,
        }
    }
}

/// Decodes one `TensorProto`; errors say "tensor `name`: ...".
pub(super) fn tensor(bytes: &[u8], cx: &mut Cx) -> Result<Tensor> {
    let label = cx.label(peek_bytes(bytes, NAME));
    within(decode(bytes, cx), || match label {
        Some(name) if !name.is_empty() => format!("tensor `{name}`"),
        _ => "tensor".to_string(),
    })
}

fn decode(bytes: &[u8], cx: &mut Cx) -> Result<Tensor> {
    cx.check_deadline()?;
    let mut t = Tensor {
        name: String::new(),
        dims: Vec::new(),
        data_type: data_type::UNDEFINED,
        data: Vec::new(),
    };
    let mut carrier: Option<Carrier> = None;
    // An upper bound of the elements the typed field holds (each takes at least one byte).
    let mut typed_elements = 0usize;
    let mut raw: &[u8] = &[];
    // `external_data` entries, or `data_location` EXTERNAL (the last one given).
    let mut external_entries = false;
    let mut located_outside = false;

    let mut fields = Fields::new(bytes);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        match field {
            DIMS => {
                let mut dims = Varints::new(value, "dims")?;
                while let Some(d) = dims.next_varint()? {
                    if t.dims.len() >= cx.limits.max_dims {
                        return Err(OnnxError::too_large(format!(
                            "more than {} dims (max_dims)",
                            cx.limits.max_dims
                        )));
                    }
                    let d = d as i64;
                    if d < 0 {
                        return Err(OnnxError::malformed(format!(
                            "dim {} is negative ({d})",
                            t.dims.len()
                        )));
                    }
                    cx.charge(std::mem::size_of::<i64>())?;
                    t.dims.push(d);
                }
            }
            DATA_TYPE => t.data_type = value.int32("data_type")?,
            NAME => t.name = cx.name(value, "name")?,
            SEGMENT => {
                return Err(OnnxError::unsupported(
                    "segmented tensors (`segment`) are not supported",
                ))
            }
            STRING_DATA => return Err(OnnxError::unsupported("string tensors are not supported")),
            EXTERNAL_DATA => {
                value.bytes("external_data")?;
                external_entries = true;
            }
            DATA_LOCATION => match value.int32("data_location")? {
                LOCATION_DEFAULT => located_outside = false,
                LOCATION_EXTERNAL => located_outside = true,
                other => {
                    return Err(OnnxError::malformed(format!(
                        "unknown data_location {other}"
                    )))
                }
            },
            _ => {
                let Some(this) = Carrier::of_field(field) else {
                    continue;
                };
                if let Some(previous) = carrier.filter(|&p| p != this) {
                    return Err(OnnxError::malformed(format!(
                        "data in both `{}` and `{}`",
                        previous.field_name(),
                        this.field_name()
                    )));
                }
                carrier = Some(this);
                let elements = match this {
                    Carrier::Raw => {
                        // A singular field: the last occurrence wins.
                        raw = value.bytes("raw_data")?;
                        0
                    }
                    Carrier::Float => fixed_run(value, 4, "float_data")?.len() / 4,
                    Carrier::Double => fixed_run(value, 8, "double_data")?.len() / 8,
                    varints => Varints::new(value, varints.field_name())?.max_len(),
                };
                typed_elements = typed_elements.saturating_add(elements);
            }
        }
    }

    // Any of these makes the data meaningless to check, so they come first.
    if external_entries || located_outside {
        return Err(OnnxError::unsupported(
            "external data (stored outside the model) is not supported",
        ));
    }
    if t.data_type == data_type::STRING {
        return Err(OnnxError::unsupported("string tensors are not supported"));
    }
    let Some(element) = element_bytes(t.data_type) else {
        if t.data_type == data_type::UNDEFINED {
            return Err(OnnxError::malformed("no data_type"));
        }
        return Err(OnnxError::unsupported(format!(
            "data type `{}` ({}) is not supported",
            data_type::name(t.data_type),
            t.data_type
        )));
    };
    let expected = expected_bytes(&t, element, cx.limits.max_tensor_bytes)?;
    match carrier {
        None => {}
        Some(Carrier::Raw) => {
            if raw.len() != expected {
                return Err(length_mismatch(&t, raw.len(), expected));
            }
            cx.charge(raw.len())?;
            t.data = raw.to_vec();
        }
        Some(typed) => {
            let wanted = Carrier::typed_for(t.data_type);
            if typed != wanted {
                return Err(OnnxError::malformed(format!(
                    "`{}` elements in `{}` (ONNX keeps them in `{}`)",
                    data_type::name(t.data_type),
                    typed.field_name(),
                    wanted.field_name()
                )));
            }
            let per_element = match typed {
                Carrier::Float => 4,
                Carrier::Double => 8,
                _ => element,
            };
            // Never more than the dims call for, nor more than the fields can hold.
            let capacity = expected.min(typed_elements.saturating_mul(per_element));
            cx.charge(capacity)?;
            t.data = Vec::with_capacity(capacity);
            typed_data(bytes, typed, per_element, expected, &mut t, cx)?;
        }
    }
    if t.data.len() != expected {
        return Err(length_mismatch(&t, t.data.len(), expected));
    }
    Ok(t)
}

/// `product(dims) * element`, refused on overflow or past `max_tensor_bytes`.
fn expected_bytes(t: &Tensor, element: usize, max_tensor_bytes: usize) -> Result<usize> {
    let too_large = || {
        OnnxError::too_large(format!(
            "dims {:?} of `{}` make more than max_tensor_bytes ({max_tensor_bytes})",
            t.dims,
            data_type::name(t.data_type)
        ))
    };
    let mut total = element;
    for &d in &t.dims {
        let d = usize::try_from(d).map_err(|_| too_large())?;
        total = total.checked_mul(d).ok_or_else(too_large)?;
    }
    if total > max_tensor_bytes {
        return Err(too_large());
    }
    Ok(total)
}

fn length_mismatch(t: &Tensor, got: usize, expected: usize) -> OnnxError {
    OnnxError::malformed(format!(
        "data is {got} bytes, but dims {:?} of `{}` call for {expected}",
        t.dims,
        data_type::name(t.data_type)
    ))
}

/// Appends the elements of every occurrence of the typed field `carrier` to `t.data`, as
/// `per_element` little-endian bytes each, stopping as soon as they pass `expected` bytes.
fn typed_data(
    bytes: &[u8],
    carrier: Carrier,
    per_element: usize,
    expected: usize,
    t: &mut Tensor,
    cx: &mut Cx,
) -> Result<()> {
    let too_much = |t: &Tensor| {
        OnnxError::malformed(format!(
            "data holds more than the {expected} bytes that dims {:?} of `{}` call for",
            t.dims,
            data_type::name(t.data_type)
        ))
    };
    let mut fields = Fields::new(bytes);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        if field != carrier.field() {
            continue;
        }
        if let Carrier::Float | Carrier::Double = carrier {
            let run = fixed_run(value, per_element, carrier.field_name())?;
            if t.data.len().saturating_add(run.len()) > expected {
                return Err(too_much(t));
            }
            t.data.extend_from_slice(run);
            continue;
        }
        let mut elements = Varints::new(value, carrier.field_name())?;
        while let Some(v) = elements.next_varint()? {
            cx.tick()?;
            if t.data.len().saturating_add(per_element) > expected {
                return Err(too_much(t));
            }
            // The element is the low bytes: int32_data holds 8- and 16-bit types (and the
            // bits of float16 and bfloat16) widened to int32, uint64_data holds uint32.
            let le = v.to_le_bytes();
            let low = le.get(..per_element).ok_or_else(|| too_much(t))?;
            t.data.extend_from_slice(low);
        }
    }
    Ok(())
}
