//! Export calls: on a blocking thread, tried inline on the caller's thread
//! first, or streaming through `tw:stream`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::Value as Json;
use wasmtime::{Store, Val};

use super::deploy::InvocationTarget;
use super::load::InlineBudget;
use crate::error::{Result, RuntimeError};
use crate::function_entry::{FunctionEntry, Prepared};
use crate::invocation_state::{classify, quiet_wasi, InvocationState};
use crate::store::InvocationStyle;
use crate::values::{args_from_json, results_to_json};
use crate::Runtime;

/// Inline overruns in a row after which a function's calls go straight to
/// the blocking pool.
const INLINE_OVERRUNS_TO_SKIP: u32 = 2;
/// A function skipping inline calls tries one again after this many calls,
/// so a rare slow spell (the thread descheduled over the budget) is not
/// remembered forever.
const INLINE_RETRY_EVERY: u32 = 256;
/// Epoch ticks of an inline attempt: at least one whole tick of run time.
const INLINE_DEADLINE_TICKS: u64 = 2;

impl Runtime {
    /// Calls export `export` of an export-style function with JSON arguments.
    pub fn invoke_export(&self, id: &str, export: &str, args: &[Json]) -> Result<Vec<Json>> {
        let start = Instant::now();
        let result = self.invoke_export_inner(id, export, args, None);
        self.finish(start, &result);
        result
    }

    /// Tries export call `export` of function `id` on the calling thread, for
    /// callers (async servers) that would otherwise hand it to a thread that
    /// may block. Only calls that can be cut short and run again unseen are
    /// tried: an export-call function already loaded, importing nothing (the
    /// call touches only its own fresh instance), in pooled guest memory, not
    /// started from a snapshot, and small in its worst case: one memory at
    /// most, of at most
    /// [`RuntimeConfig::inline_max_memory_bytes`](crate::RuntimeConfig::inline_max_memory_bytes)
    /// (8 MiB by default) initially and during the call (a call growing past
    /// it is cut short and run again on a blocking thread), tables of at most
    /// [`INLINE_MAX_TABLE_ELEMENTS`](crate::INLINE_MAX_TABLE_ELEMENTS)
    /// elements: one uninterruptible instruction (`memory.fill`) and the
    /// reset of the instance's pooled slot stay that small on the caller's
    /// thread. The attempt, instantiation included, has an
    /// epoch deadline two ticks away: at least one whole tick
    /// ([`RuntimeConfig::epoch_tick`](crate::RuntimeConfig::epoch_tick), 5 ms
    /// by default) and at most two; or the function's own deadline when that
    /// is shorter, and then a timeout is its outcome, as it would be on the
    /// blocking pool.
    ///
    /// `None`: not tried, or cut short at the deadline (nothing of the
    /// attempt remains). The caller then runs [`Runtime::invoke_export`]
    /// where blocking is allowed. `Some`: the call's outcome, exactly what
    /// `invoke_export` would have returned. After two overruns in a row a
    /// function's calls skip the attempt, except one in 256 that tries again.
    pub fn try_invoke_export_inline(
        &self,
        id: &str,
        export: &str,
        args: &[Json],
    ) -> Option<Result<Vec<Json>>> {
        let entry = self.entry(id).ok()?;
        self.try_invoke_inline(&entry, export, args)
    }

    /// [`Runtime::try_invoke_export_inline`] of a function already looked up.
    pub fn try_invoke_target_inline(
        &self,
        target: &InvocationTarget,
        export: &str,
        args: &[Json],
    ) -> Option<Result<Vec<Json>>> {
        self.try_invoke_inline(&target.entry, export, args)
    }

    fn try_invoke_inline(
        &self,
        entry: &FunctionEntry,
        export: &str,
        args: &[Json],
    ) -> Option<Result<Vec<Json>>> {
        if !self.inner.config.inline_calls || self.inner.memory_creator.is_some() {
            return None;
        }
        if entry.record.style != InvocationStyle::Export
            || entry.record.start_from_snapshot.is_some()
        {
            return None;
        }
        // Only a loaded module runs inline: loading one would block this thread.
        let prepared = self.cached_prepared(&entry.record.module_sha256)?;
        crate::trace::note_coldstart(false);
        if !prepared.self_contained || !prepared.fits_inline {
            return None;
        }
        if entry.inline_overruns.load(Ordering::Relaxed) >= INLINE_OVERRUNS_TO_SKIP {
            let skipped = entry.inline_skipped.fetch_add(1, Ordering::Relaxed) + 1;
            if skipped < INLINE_RETRY_EVERY {
                return None;
            }
            entry.inline_skipped.store(0, Ordering::Relaxed);
        }
        // A function whose own deadline is shorter keeps it: then a timeout
        // here is its real outcome, not an overrun to run again.
        let own_ticks = self.deadline_ticks(&entry.record.limits);
        let ticks = own_ticks.min(INLINE_DEADLINE_TICKS);
        let start = Instant::now();
        let budget = InlineBudget {
            ticks,
            max_memory_bytes: self.inner.config.inline_max_memory_bytes,
        };
        let mut cut_at_caps = false;
        let result = self.call_export(
            entry,
            &prepared,
            export,
            args,
            None,
            Some((budget, &mut cut_at_caps)),
        );
        if cut_at_caps {
            // The call needs more than an inline call may have: a strike, and
            // the blocking pool runs it again from a fresh instance.
            entry.inline_overruns.fetch_add(1, Ordering::Relaxed);
            self.inner.metrics.inline_overran.inc();
            return None;
        }
        if let Err(RuntimeError::Timeout { .. }) = result {
            // Either way a strike: calls that run into a deadline belong on
            // the blocking pool.
            entry.inline_overruns.fetch_add(1, Ordering::Relaxed);
            if ticks < own_ticks {
                self.inner.metrics.inline_overran.inc();
                tracing::debug!(function = %entry.record.id, "inline call overran its budget; run again on the blocking pool");
                return None;
            }
        } else {
            entry.inline_overruns.store(0, Ordering::Relaxed);
        }
        self.inner.metrics.inline_done.inc();
        self.finish(start, &result);
        Some(result)
    }

    /// [`Runtime::invoke_export`] with `tw:stream` connected: the guest reads
    /// `io`'s input and its chunks go to `io`'s channel as they are emitted.
    pub fn invoke_export_streaming(
        &self,
        id: &str,
        export: &str,
        args: &[Json],
        io: crate::stream::StreamIo,
    ) -> Result<Vec<Json>> {
        let start = Instant::now();
        let result = self.invoke_export_inner(id, export, args, Some(io));
        self.finish(start, &result);
        result
    }

    /// Checks an export call (export exists, arguments fit its signature)
    /// without running anything, so a streaming response can still answer
    /// a proper 4xx before it starts.
    pub fn check_export_call(&self, id: &str, export: &str, args: &[Json]) -> Result<()> {
        let entry = self.entry(id)?;
        if entry.record.style != InvocationStyle::Export {
            return Err(Runtime::wrong_style(id, entry.record.style));
        }
        if entry.record.component {
            return self.check_component_export(&entry, export, args);
        }
        let prepared = self.prepared(&entry)?;
        let ty = prepared
            .funcs
            .get(export)
            .ok_or_else(|| RuntimeError::UnknownExport(export.to_owned()))?;
        args_from_json(export, ty, args).map(|_| ())
    }

    fn invoke_export_inner(
        &self,
        id: &str,
        export: &str,
        args: &[Json],
        stream: Option<crate::stream::StreamIo>,
    ) -> Result<Vec<Json>> {
        let entry = self.entry(id)?;
        if entry.record.style != InvocationStyle::Export {
            return Err(Runtime::wrong_style(id, entry.record.style));
        }
        if entry.record.component {
            if stream.is_some() {
                return Err(RuntimeError::UnsupportedFeature(format!(
                    "function {id} is a component: streaming a typed export's output is not \
                     built yet; call it through /invoke"
                )));
            }
            return self.call_component_export(&entry, export, args);
        }
        let prepared = self.prepared(&entry)?;
        self.call_export(&entry, &prepared, export, args, stream, None)
    }

    /// Instantiates export-call function `entry` and calls `export` with
    /// `args`: under its own limits, or as an inline attempt under `inline`'s
    /// budget (whose flag is set when the call was cut short at its caps).
    fn call_export(
        &self,
        entry: &FunctionEntry,
        prepared: &Prepared,
        export: &str,
        args: &[Json],
        stream: Option<crate::stream::StreamIo>,
        inline: Option<(InlineBudget, &mut bool)>,
    ) -> Result<Vec<Json>> {
        let record = &entry.record;
        let ty = prepared
            .funcs
            .get(export)
            .ok_or_else(|| RuntimeError::UnknownExport(export.to_owned()))?;
        let params = args_from_json(export, ty, args)?;
        let _slot = self.take_slot()?;
        let wasi = prepared
            .needs_wasi
            .then(|| quiet_wasi(&record.name, self.inner.config.stderr_tail_bytes));
        let (budget, cut_at_caps) = match inline {
            Some((budget, cut)) => (Some(budget), Some(cut)),
            None => (None, None),
        };
        let (mut store, instance) = self.instantiate_with_deadline(prepared, record, wasi, budget);
        store.data_mut().stream = stream;
        let result = self.run_export(entry, prepared, export, ty, &params, &mut store, instance);
        if let Some(cut) = cut_at_caps {
            *cut = store.data().inline_cap_hit();
        }
        result
    }

    /// Runs `export` in the instance just created in `store`.
    #[allow(clippy::too_many_arguments)]
    fn run_export(
        &self,
        entry: &FunctionEntry,
        prepared: &Prepared,
        export: &str,
        ty: &wasmtime::FuncType,
        params: &[Val],
        store: &mut Store<InvocationState>,
        instance: wasmtime::Result<wasmtime::Instance>,
    ) -> Result<Vec<Json>> {
        let record = &entry.record;
        let instance = instance.map_err(|e| classify(e, store, &record.limits))?;
        if let Some(snapshot) = &record.start_from_snapshot {
            // The snapshot holds the state after `_initialize` and the init export.
            self.restore_snapshot(entry, prepared, snapshot, &mut *store, &instance)?;
        } else if prepared.has_initialize {
            if let Some(init) = instance.get_func(&mut *store, "_initialize") {
                init.call(&mut *store, &[], &mut [])
                    .map_err(|e| classify(e, &mut *store, &record.limits))?;
            }
        }
        let func = instance
            .get_func(&mut *store, export)
            .ok_or_else(|| RuntimeError::UnknownExport(export.to_owned()))?;
        let mut results = vec![Val::I32(0); ty.results().len()];
        func.call(&mut *store, params, &mut results)
            .map_err(|e| classify(e, &mut *store, &record.limits))?;
        Ok(results_to_json(&results))
    }
}
