//! The protobuf wire format, read with every length checked against the enclosing message:
//! varints, field tags, the four wire types ONNX uses, packed and unpacked repeated scalars;
//! and [`Cx`], which carries the limits, the deadline and the allocation budget through a
//! decode.

use std::time::Instant;

use super::Limits;
use crate::{OnnxError, Result};

/// A varint carries 7 bits a byte, so 64 bits take at most 10 bytes.
const MAX_VARINT_BYTES: usize = 10;

/// The largest protobuf field number (2^29 - 1).
const MAX_FIELD_NUMBER: u64 = (1 << 29) - 1;

/// How many fields or list elements pass between two looks at the clock.
const DEADLINE_EVERY: u32 = 1024;

/// The decoded model may take at most this many times its encoded size in memory (counting
/// each item's struct and its heap bytes), plus 1 MiB; past that the decode fails with
/// [`ErrorCode::TooLarge`](crate::ErrorCode::TooLarge). The format alone expands by up to 8
/// (an `int64` element written as a one-byte varint); the rest of the margin is for the
/// per-item overhead of names and lists, which a well-formed model never comes close to.
pub(super) const DECODED_BYTES_PER_INPUT_BYTE: usize = 16;

/// Reads one varint from the front of `buf` and advances past it.
pub(super) fn read_varint(buf: &mut &[u8]) -> Result<u64> {
    let mut value = 0u64;
    for i in 0..MAX_VARINT_BYTES {
        let Some((&byte, rest)) = buf.split_first() else {
            return Err(OnnxError::malformed("truncated varint"));
        };
        *buf = rest;
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            // The tenth byte holds only the 64th bit.
            if i == MAX_VARINT_BYTES - 1 && byte > 1 {
                return Err(OnnxError::malformed("varint overflows 64 bits"));
            }
            return Ok(value);
        }
    }
    Err(OnnxError::malformed("varint longer than 10 bytes"))
}

/// Splits `n` bytes off the front of `buf`, or fails if fewer remain.
fn take<'a>(buf: &mut &'a [u8], n: u64, field: u32) -> Result<&'a [u8]> {
    let Some(n) = usize::try_from(n).ok().filter(|&n| n <= buf.len()) else {
        return Err(OnnxError::malformed(format!(
            "truncated field {field}: {n} bytes declared, {} left",
            buf.len()
        )));
    };
    let (head, tail) = buf.split_at(n);
    *buf = tail;
    Ok(head)
}

/// One field's payload, by wire type. Slices borrow the input.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1: 8 little-endian bytes.
    Fixed64(&'a [u8]),
    /// Wire type 2: a length-delimited payload (string, bytes, message, packed scalars).
    Bytes(&'a [u8]),
    /// Wire type 5: 4 little-endian bytes.
    Fixed32(&'a [u8]),
}

impl<'a> Value<'a> {
    fn wire_name(&self) -> &'static str {
        match self {
            Value::Varint(_) => "varint",
            Value::Fixed64(_) => "64-bit",
            Value::Bytes(_) => "length-delimited",
            Value::Fixed32(_) => "32-bit",
        }
    }

    fn wrong(&self, what: &str, expected: &str) -> OnnxError {
        OnnxError::malformed(format!(
            "`{what}` has wire type {}, expected {expected}",
            self.wire_name()
        ))
    }

    /// The value of a varint field.
    pub(super) fn varint(self, what: &str) -> Result<u64> {
        match self {
            Value::Varint(v) => Ok(v),
            other => Err(other.wrong(what, "varint")),
        }
    }

    /// The value of an `int64` field (two's complement in 64 bits).
    pub(super) fn int64(self, what: &str) -> Result<i64> {
        Ok(self.varint(what)? as i64)
    }

    /// The value of an `int32` or enum field (sign-extended to 64 bits on the wire).
    pub(super) fn int32(self, what: &str) -> Result<i32> {
        let v = self.int64(what)?;
        i32::try_from(v)
            .map_err(|_| OnnxError::malformed(format!("`{what}` is {v}, out of range for int32")))
    }

    /// The payload of a length-delimited field.
    pub(super) fn bytes(self, what: &str) -> Result<&'a [u8]> {
        match self {
            Value::Bytes(b) => Ok(b),
            other => Err(other.wrong(what, "length-delimited")),
        }
    }

    /// The value of a `float` field.
    pub(super) fn float(self, what: &str) -> Result<f32> {
        match self {
            Value::Fixed32(b) => <[u8; 4]>::try_from(b)
                .map(f32::from_le_bytes)
                .map_err(|_| self.wrong(what, "32-bit")),
            other => Err(other.wrong(what, "32-bit")),
        }
    }
}

/// The fields of one message, in order. Every length is checked against what remains of
/// the message; unknown fields are returned like known ones, for the caller to skip.
pub(super) struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    /// The fields of the message `bytes`.
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Fields { rest: bytes }
    }

    /// The next field's number and payload, or `None` at the end of the message.
    pub(super) fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let tag = read_varint(&mut self.rest)?;
        let number = tag >> 3;
        if number == 0 || number > MAX_FIELD_NUMBER {
            return Err(OnnxError::malformed(format!(
                "invalid field number {number}"
            )));
        }
        let field = number as u32;
        let value = match tag & 7 {
            0 => Value::Varint(read_varint(&mut self.rest)?),
            1 => Value::Fixed64(take(&mut self.rest, 8, field)?),
            2 => {
                let len = read_varint(&mut self.rest)?;
                Value::Bytes(take(&mut self.rest, len, field)?)
            }
            5 => Value::Fixed32(take(&mut self.rest, 4, field)?),
            3 | 4 => {
                return Err(OnnxError::malformed(format!(
                    "field {field} uses the group wire type, which ONNX never writes"
                )))
            }
            wire => {
                return Err(OnnxError::malformed(format!(
                    "field {field} has invalid wire type {wire}"
                )))
            }
        };
        Ok(Some((field, value)))
    }
}

/// The last occurrence of the length-delimited field `field` in `bytes`, found without
/// decoding anything else; `None` if absent or if the message is malformed before it (the
/// real decode then reports that). Used to name a node or tensor in errors found before the
/// field holding its name.
pub(super) fn peek_bytes(bytes: &[u8], field: u32) -> Option<&[u8]> {
    let mut fields = Fields::new(bytes);
    let mut found = None;
    while let Ok(Some((number, value))) = fields.next_field() {
        if let (true, Value::Bytes(b)) = (number == field, value) {
            found = Some(b);
        }
    }
    found
}

/// The elements of one occurrence of a repeated varint field: a single varint (unpacked)
/// or a run of them (packed). A repeated field may mix both across occurrences.
pub(super) struct Varints<'a> {
    single: Option<u64>,
    packed: &'a [u8],
}

impl<'a> Varints<'a> {
    /// The elements carried by `value`, a field named `what`.
    pub(super) fn new(value: Value<'a>, what: &str) -> Result<Self> {
        match value {
            Value::Varint(v) => Ok(Varints {
                single: Some(v),
                packed: &[],
            }),
            Value::Bytes(b) => Ok(Varints {
                single: None,
                packed: b,
            }),
            other => Err(other.wrong(what, "varint or packed varints")),
        }
    }

    /// An upper bound of the elements left (each takes at least one byte).
    pub(super) fn max_len(&self) -> usize {
        usize::from(self.single.is_some()) + self.packed.len()
    }

    /// The next element, or `None` when done.
    pub(super) fn next_varint(&mut self) -> Result<Option<u64>> {
        if let Some(v) = self.single.take() {
            return Ok(Some(v));
        }
        if self.packed.is_empty() {
            return Ok(None);
        }
        read_varint(&mut self.packed).map(Some)
    }
}

/// The little-endian bytes of one occurrence of a repeated fixed-width field (`width` 4 or
/// 8): the one element of an unpacked occurrence, or a packed run, checked to be a whole
/// number of elements.
pub(super) fn fixed_run<'a>(value: Value<'a>, width: usize, what: &str) -> Result<&'a [u8]> {
    match (value, width) {
        (Value::Fixed32(b), 4) | (Value::Fixed64(b), 8) => Ok(b),
        (Value::Bytes(b), _) if b.len() % width == 0 => Ok(b),
        (Value::Bytes(b), _) => Err(OnnxError::malformed(format!(
            "packed `{what}` is {} bytes, not a whole number of {width}-byte elements",
            b.len()
        ))),
        (other, _) => Err(other.wrong(
            what,
            if width == 4 {
                "32-bit or packed"
            } else {
                "64-bit or packed"
            },
        )),
    }
}

/// Prefixes an error's message with where it happened ("node 3 (`Conv`)"), keeping its code.
pub(super) fn within<T>(result: Result<T>, place: impl FnOnce() -> String) -> Result<T> {
    result.map_err(|e| OnnxError::new(e.code, format!("{}: {}", place(), e.message)))
}

/// Names an item for error messages: "node 3 (`Conv`)", or "node 3" when the label is
/// unknown.
pub(super) fn place(kind: &str, index: usize, label: Option<&str>) -> String {
    match label {
        Some(label) if !label.is_empty() => format!("{kind} {index} (`{label}`)"),
        _ => format!("{kind} {index}"),
    }
}

/// What a decode carries along: the limits, the deadline's tick counter and the allocation
/// budget.
pub(super) struct Cx<'l> {
    /// The limits the decode checks.
    pub(super) limits: &'l Limits,
    ticks: u32,
    charged: usize,
    max_charged: usize,
}

impl<'l> Cx<'l> {
    /// Starts a decode of `input_len` bytes: refuses input over `max_model_bytes` and a
    /// deadline already past.
    pub(super) fn new(limits: &'l Limits, input_len: usize) -> Result<Self> {
        if input_len > limits.max_model_bytes {
            return Err(OnnxError::too_large(format!(
                "input is {input_len} bytes, more than max_model_bytes ({})",
                limits.max_model_bytes
            )));
        }
        let cx = Cx {
            limits,
            ticks: 0,
            charged: 0,
            max_charged: input_len
                .saturating_mul(DECODED_BYTES_PER_INPUT_BYTE)
                .saturating_add(1 << 20),
        };
        cx.check_deadline()?;
        Ok(cx)
    }

    /// Fails if the deadline has passed.
    pub(super) fn check_deadline(&self) -> Result<()> {
        match self.limits.deadline {
            Some(deadline) if Instant::now() >= deadline => Err(OnnxError::deadline(
                "decoding ran past its deadline".to_string(),
            )),
            _ => Ok(()),
        }
    }

    /// Counts one unit of work (a field, a list element) and looks at the clock every
    /// [`DEADLINE_EVERY`] of them.
    pub(super) fn tick(&mut self) -> Result<()> {
        self.ticks = self.ticks.wrapping_add(1);
        if self.ticks.is_multiple_of(DEADLINE_EVERY) {
            self.check_deadline()
        } else {
            Ok(())
        }
    }

    /// Accounts for `bytes` about to be allocated; fails past the budget.
    pub(super) fn charge(&mut self, bytes: usize) -> Result<()> {
        self.charged = self.charged.saturating_add(bytes);
        if self.charged > self.max_charged {
            return Err(OnnxError::too_large(format!(
                "the decoded model would take more than {DECODED_BYTES_PER_INPUT_BYTE} times \
                 its encoded size"
            )));
        }
        Ok(())
    }

    /// A name (of a node, value, tensor, attribute, domain, ...): at most `max_name_bytes`,
    /// UTF-8. Charges its bytes.
    pub(super) fn name(&mut self, value: Value<'_>, what: &str) -> Result<String> {
        let bytes = value.bytes(what)?;
        if bytes.len() > self.limits.max_name_bytes {
            return Err(OnnxError::too_large(format!(
                "`{what}` is {} bytes, more than max_name_bytes ({})",
                bytes.len(),
                self.limits.max_name_bytes
            )));
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|_| OnnxError::malformed(format!("`{what}` is not UTF-8")))?;
        self.charge(text.len())?;
        Ok(text.to_owned())
    }

    /// The label a peeked name gives an item in error messages, if it is a valid name.
    pub(super) fn label<'b>(&self, bytes: Option<&'b [u8]>) -> Option<&'b str> {
        bytes
            .filter(|b| b.len() <= self.limits.max_name_bytes)
            .and_then(|b| std::str::from_utf8(b).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn varints_of_every_length_decode() {
        let cases: [(&[u8], u64); 4] = [
            (&[0x00], 0),
            (&[0x96, 0x01], 150),
            (
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                u64::MAX,
            ),
            (
                &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00],
                0,
            ),
        ];
        for (bytes, want) in cases {
            let mut buf = bytes;
            assert_eq!(read_varint(&mut buf).unwrap(), want, "{bytes:x?}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn overlong_and_overflowing_varints_are_malformed() {
        let eleven = [0x80u8; 10]
            .iter()
            .chain(&[0x00])
            .copied()
            .collect::<Vec<_>>();
        let overflow = [0xffu8; 9]
            .iter()
            .chain(&[0x02])
            .copied()
            .collect::<Vec<_>>();
        for bytes in [&eleven[..], &overflow[..], &[0x80][..], &[][..]] {
            let err = read_varint(&mut &bytes[..]).unwrap_err();
            assert_eq!(err.code, ErrorCode::Malformed, "{bytes:x?}");
        }
    }

    #[test]
    fn the_allocation_budget_refuses_past_its_factor() {
        let limits = Limits::default();
        let mut cx = Cx::new(&limits, 1000).unwrap();
        let budget = 1000 * DECODED_BYTES_PER_INPUT_BYTE + (1 << 20);
        cx.charge(budget).unwrap();
        assert_eq!(cx.charge(1).unwrap_err().code, ErrorCode::TooLarge);
    }

    #[test]
    fn packed_fixed_runs_must_be_whole_elements() {
        assert_eq!(fixed_run(Value::Bytes(&[0; 8]), 4, "f").unwrap().len(), 8);
        let err = fixed_run(Value::Bytes(&[0; 7]), 4, "f").unwrap_err();
        assert_eq!(err.code, ErrorCode::Malformed);
        let err = fixed_run(Value::Fixed64(&[0; 8]), 4, "f").unwrap_err();
        assert_eq!(err.code, ErrorCode::Malformed);
    }
}
