//! ONNX tensor element types (`TensorProto.DataType`): their numbers, names and sizes.

/// No type given.
pub const UNDEFINED: i32 = 0;
/// 32-bit IEEE float.
pub const FLOAT: i32 = 1;
/// Unsigned 8-bit integer.
pub const UINT8: i32 = 2;
/// Signed 8-bit integer.
pub const INT8: i32 = 3;
/// Unsigned 16-bit integer.
pub const UINT16: i32 = 4;
/// Signed 16-bit integer.
pub const INT16: i32 = 5;
/// Signed 32-bit integer.
pub const INT32: i32 = 6;
/// Signed 64-bit integer.
pub const INT64: i32 = 7;
/// Byte strings (not supported by the executor).
pub const STRING: i32 = 8;
/// Boolean, one byte (0 or 1).
pub const BOOL: i32 = 9;
/// 16-bit IEEE half float.
pub const FLOAT16: i32 = 10;
/// 64-bit IEEE float.
pub const DOUBLE: i32 = 11;
/// Unsigned 32-bit integer.
pub const UINT32: i32 = 12;
/// Unsigned 64-bit integer.
pub const UINT64: i32 = 13;
/// Complex number of two 32-bit floats (real, imaginary).
pub const COMPLEX64: i32 = 14;
/// Complex number of two 64-bit floats (real, imaginary).
pub const COMPLEX128: i32 = 15;
/// bfloat16: the top 16 bits of a 32-bit float.
pub const BFLOAT16: i32 = 16;
/// 8-bit float, 4 exponent and 3 mantissa bits, no infinities.
pub const FLOAT8E4M3FN: i32 = 17;
/// 8-bit float, 4 exponent and 3 mantissa bits, no infinities, no negative zero.
pub const FLOAT8E4M3FNUZ: i32 = 18;
/// 8-bit float, 5 exponent and 2 mantissa bits.
pub const FLOAT8E5M2: i32 = 19;
/// 8-bit float, 5 exponent and 2 mantissa bits, no infinities, no negative zero.
pub const FLOAT8E5M2FNUZ: i32 = 20;
/// Unsigned 4-bit integer, two to a byte.
pub const UINT4: i32 = 21;
/// Signed 4-bit integer, two to a byte.
pub const INT4: i32 = 22;
/// 4-bit float (2 exponent bits, 1 mantissa bit), two to a byte.
pub const FLOAT4E2M1: i32 = 23;

/// The type's name as ONNX's type strings spell it (`"float"`, `"int64"`, `"float16"`, ...),
/// or `"unknown"` for a number this module does not know.
pub fn name(t: i32) -> &'static str {
    match t {
        UNDEFINED => "undefined",
        FLOAT => "float",
        UINT8 => "uint8",
        INT8 => "int8",
        UINT16 => "uint16",
        INT16 => "int16",
        INT32 => "int32",
        INT64 => "int64",
        STRING => "string",
        BOOL => "bool",
        FLOAT16 => "float16",
        DOUBLE => "double",
        UINT32 => "uint32",
        UINT64 => "uint64",
        COMPLEX64 => "complex64",
        COMPLEX128 => "complex128",
        BFLOAT16 => "bfloat16",
        FLOAT8E4M3FN => "float8e4m3fn",
        FLOAT8E4M3FNUZ => "float8e4m3fnuz",
        FLOAT8E5M2 => "float8e5m2",
        FLOAT8E5M2FNUZ => "float8e5m2fnuz",
        UINT4 => "uint4",
        INT4 => "int4",
        FLOAT4E2M1 => "float4e2m1",
        _ => "unknown",
    }
}

/// The size of one element in bytes; `None` for types without a whole-byte fixed size
/// (undefined, string, the 4-bit types) and for unknown numbers. A tensor's `data` is
/// exactly `product(dims)` times this.
pub fn element_bytes(t: i32) -> Option<usize> {
    match t {
        UINT8 | INT8 | BOOL | FLOAT8E4M3FN | FLOAT8E4M3FNUZ | FLOAT8E5M2 | FLOAT8E5M2FNUZ => {
            Some(1)
        }
        UINT16 | INT16 | FLOAT16 | BFLOAT16 => Some(2),
        FLOAT | INT32 | UINT32 => Some(4),
        INT64 | DOUBLE | UINT64 | COMPLEX64 => Some(8),
        COMPLEX128 => Some(16),
        _ => None,
    }
}
