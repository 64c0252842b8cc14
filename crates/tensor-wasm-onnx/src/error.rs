//! Errors of the ONNX executor: a stable code (what clients and guests match on) and a
//! message naming the operator, tensor or field at fault.

use std::fmt;

/// What went wrong, as a stable code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The bytes are not a well-formed ONNX model (truncated, a wrong wire type, bad UTF-8,
    /// a field out of range).
    Malformed,
    /// The model, or something in it, is larger than a configured limit.
    TooLarge,
    /// Well-formed, but uses something this executor does not run (an operator, a dtype,
    /// an attribute value, external data); the message names it.
    Unsupported,
    /// The graph is inconsistent: a cycle, an undefined value, shapes that do not agree.
    InvalidGraph,
    /// An input tensor does not match what the graph expects (count, name, dtype, shape).
    InvalidInput,
    /// Parsing or planning ran past its deadline.
    Deadline,
    /// A kernel launch failed or was cancelled; the message says why.
    Kernel,
}

impl ErrorCode {
    /// The code as text (`onnx_malformed`, ...): stable, part of the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "onnx_malformed",
            ErrorCode::TooLarge => "onnx_too_large",
            ErrorCode::Unsupported => "onnx_unsupported",
            ErrorCode::InvalidGraph => "onnx_invalid_graph",
            ErrorCode::InvalidInput => "onnx_invalid_input",
            ErrorCode::Deadline => "onnx_deadline",
            ErrorCode::Kernel => "onnx_kernel",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error of the executor: a code and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct OnnxError {
    /// The stable code.
    pub code: ErrorCode,
    /// What happened, naming the operator, tensor or field.
    pub message: String,
}

impl OnnxError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        OnnxError {
            code,
            message: message.into(),
        }
    }
}

/// Shorthands for the constructors, one per code.
macro_rules! constructors {
    ($($name:ident => $code:ident),* $(,)?) => {
        impl OnnxError {
            $(
                #[doc = concat!("An [`ErrorCode::", stringify!($code), "`] error.")]
                pub fn $name(message: impl Into<String>) -> Self {
                    OnnxError::new(ErrorCode::$code, message)
                }
            )*
        }
    };
}

constructors! {
    malformed => Malformed,
    too_large => TooLarge,
    unsupported => Unsupported,
    invalid_graph => InvalidGraph,
    invalid_input => InvalidInput,
    deadline => Deadline,
    kernel => Kernel,
}

/// The executor's results.
pub type Result<T> = std::result::Result<T, OnnxError>;
