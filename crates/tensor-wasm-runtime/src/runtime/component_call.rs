//! Typed exports of components: a call's JSON arguments checked and converted by the export's
//! WIT types (`component_values`) before anything runs, then the call in a fresh instance with
//! the function's limits, and its results back as JSON; the exports' WIT types as the API
//! lists them.

use serde_json::Value as Json;
use wasmtime::component::{types::ComponentItem, Val};

use super::command::{log_stderr, quiet_component_ctx, CommandStore};
use crate::component::LoadedComponent;
use crate::component_values::{func_wit, to_json, to_val, TypedExport};
use crate::error::{Result, RuntimeError};
use crate::function_entry::FunctionEntry;
use crate::Runtime;

/// Largest stderr a typed export may write (it is logged, not returned).
const STDERR_CAP: usize = 64 << 10;

impl Runtime {
    /// The typed exports of `loaded` with their WIT types, in the component's order (none for
    /// commands and HTTP handlers).
    pub(super) fn typed_exports(&self, loaded: &LoadedComponent) -> Vec<TypedExport> {
        let LoadedComponent::Exports(pre) = loaded else {
            return Vec::new();
        };
        let engine = &self.inner.components.engine;
        pre.component()
            .component_type()
            .exports(engine)
            .filter_map(|(name, item)| match item.ty {
                ComponentItem::ComponentFunc(func) => Some(TypedExport {
                    name: name.to_owned(),
                    wit: func_wit(&func),
                }),
                _ => None,
            })
            .collect()
    }

    /// The instance-to-be of component function `entry` and `args` converted for `export`.
    fn component_call(
        &self,
        entry: &FunctionEntry,
        export: &str,
        args: &[Json],
    ) -> Result<(
        std::sync::Arc<wasmtime::component::InstancePre<crate::component::ComponentState>>,
        Vec<Val>,
        usize,
    )> {
        let LoadedComponent::Exports(pre) = self.component_of(entry)? else {
            return Err(Runtime::wrong_style(&entry.record.id, entry.record.style));
        };
        let engine = &self.inner.components.engine;
        let ty = pre.component().component_type();
        let Some(ComponentItem::ComponentFunc(func)) = ty.get_export(engine, export).map(|e| e.ty)
        else {
            return Err(RuntimeError::UnknownExport(export.to_owned()));
        };
        let params: Vec<_> = func.params().map(|(n, t)| (n.to_owned(), t)).collect();
        if args.len() != params.len() {
            let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
            return Err(RuntimeError::InvalidArguments(format!(
                "{export} takes {} argument(s) ({}), got {}",
                params.len(),
                names.join(", "),
                args.len()
            )));
        }
        let vals = args
            .iter()
            .zip(&params)
            .enumerate()
            .map(|(i, (arg, (name, ty)))| to_val(arg, ty, &format!("args[{i}] ({name})")))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|m| RuntimeError::InvalidArguments(m.0))?;
        let results = func.results().len();
        Ok((pre, vals, results))
    }

    /// Checks a call of typed export `export` of component function `entry` without running
    /// anything.
    pub(super) fn check_component_export(
        &self,
        entry: &FunctionEntry,
        export: &str,
        args: &[Json],
    ) -> Result<()> {
        self.component_call(entry, export, args).map(drop)
    }

    /// Calls typed export `export` of component function `entry` with `args`, in a fresh
    /// instance, within the function's limits.
    pub(super) fn call_component_export(
        &self,
        entry: &FunctionEntry,
        export: &str,
        args: &[Json],
    ) -> Result<Vec<Json>> {
        let (pre, params, results) = self.component_call(entry, export, args)?;
        let _slot = self.take_slot()?;
        let record = &entry.record;
        let (ctx, stderr) = quiet_component_ctx(record, STDERR_CAP);
        let mut store = self.component_store(record, ctx);
        let mut out = vec![Val::Bool(false); results];
        let deadline = store.data().deadline;
        let called = crate::component::run_until(deadline, &self.cancelled("export"), async {
            let instance =
                crate::component::instantiate_retrying!(pre.instantiate_async(&mut store))?;
            let func = instance
                .get_func(&mut store, export)
                .ok_or_else(|| wasmtime::Error::msg(format!("export {export} vanished")))?;
            func.call_async(&mut store, &params, &mut out).await
        });
        log_stderr(record, &stderr.contents());
        match called {
            Ok(()) => Ok(out.iter().map(to_json).collect()),
            Err(e) => Err(CommandStore::Component(store).classify(e, &record.limits)),
        }
    }
}
