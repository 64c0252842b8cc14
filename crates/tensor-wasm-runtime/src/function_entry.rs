//! A deployed function as the runtime holds it in memory: its record and what
//! its inline calls and snapshot restores remember between calls; and
//! [`Prepared`], the compiled and linked form of a module, which the runtime's
//! bounded loaded-module cache holds by module hash.

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use wasmtime::{FuncType, InstancePre};

use crate::invocation_state::InvocationState;
use crate::store::FunctionRecord;

/// A module compiled and linked, ready to instantiate. Everything here depends on
/// the module only, so functions deployed from the same module share one.
pub(crate) struct Prepared {
    pub(crate) pre: InstancePre<InvocationState>,
    pub(crate) needs_wasi: bool,
    pub(crate) needs_gpu: bool,
    /// Whether the module imports `wasi_ephemeral_nn` (its instances get `wasi-nn` state).
    pub(crate) needs_nn: bool,
    /// Function exports and their types, resolved once.
    pub(crate) funcs: HashMap<String, FuncType>,
    /// Whether the module is a reactor with an `_initialize` to run first.
    pub(crate) has_initialize: bool,
    /// Indices of the mutable globals the instrumentation exported, ascending.
    pub(crate) state_globals: Vec<u32>,
    /// Whether the module imports nothing: a call can touch nothing but its
    /// own fresh instance, so an attempt cut short can be run again unseen.
    pub(crate) self_contained: bool,
    /// Whether the module is small enough in its worst case to be tried
    /// inline: one memory at most, initially within the inline memory cap,
    /// tables within [`crate::INLINE_MAX_TABLE_ELEMENTS`].
    pub(crate) fits_inline: bool,
}

/// A deployed function: its record and what loading and calling it leave behind.
pub(crate) struct FunctionEntry {
    pub(crate) record: FunctionRecord,
    /// Held while this function's module is loaded into the cache, so that
    /// concurrent first calls load it once.
    pub(crate) load_lock: Mutex<()>,
    /// The opened local image of `record.start_from_snapshot`, once first used.
    pub(crate) restore: Mutex<Option<Arc<crate::snapshot::Restorable>>>,
    /// Inline calls of this function cut short in a row (reset by one that
    /// finishes); see
    /// [`Runtime::try_invoke_export_inline`](crate::Runtime::try_invoke_export_inline).
    pub(crate) inline_overruns: AtomicU32,
    /// Calls that skipped the inline attempt since the last one tried.
    pub(crate) inline_skipped: AtomicU32,
}

impl FunctionEntry {
    pub(crate) fn new(record: FunctionRecord) -> Self {
        FunctionEntry {
            record,
            load_lock: Mutex::new(()),
            restore: Mutex::new(None),
            inline_overruns: AtomicU32::new(0),
            inline_skipped: AtomicU32::new(0),
        }
    }
}
