//! WebAssembly components (WASI 0.2) at deploy: recognised, validated and classified by what
//! they export, then refused with an error that says what was found and that running
//! components is not built yet (issue 20, docs/components.md). Core modules are unaffected.

use wasmparser::{ComponentExternalKind, Parser, Payload, Validator, WasmFeatures};

use crate::error::RuntimeError;

/// How a component would be invoked, from its exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentStyle {
    /// Exports `wasi:http/incoming-handler`: an HTTP handler.
    HttpHandler,
    /// Exports `wasi:cli/run`: a command (stdin in, stdout out).
    Command,
    /// Exports functions of its own (typed exports), by name.
    TypedExports(Vec<String>),
    /// Exports nothing invocable.
    Nothing,
}

impl ComponentStyle {
    fn describe(&self) -> String {
        match self {
            ComponentStyle::HttpHandler => {
                "an HTTP handler (it exports wasi:http/incoming-handler)".into()
            }
            ComponentStyle::Command => "a WASI 0.2 command (it exports wasi:cli/run)".into(),
            ComponentStyle::TypedExports(names) => {
                format!("a component with typed exports ({})", names.join(", "))
            }
            ComponentStyle::Nothing => "a component that exports nothing to invoke".into(),
        }
    }
}

/// Whether `binary` is a component rather than a core module.
pub(crate) fn is_component(binary: &[u8]) -> bool {
    Parser::is_component(binary)
}

/// Validates component `binary` and classifies it by its top-level exports.
///
/// # Errors
/// [`RuntimeError::InvalidModule`] when it is not a valid component.
pub fn classify(binary: &[u8]) -> Result<ComponentStyle, RuntimeError> {
    Validator::new_with_features(WasmFeatures::all())
        .validate_all(binary)
        .map_err(|e| RuntimeError::InvalidModule(format!("invalid component: {e}")))?;
    let mut depth = 0usize;
    let (mut http, mut command, mut funcs) = (false, false, Vec::new());
    for payload in Parser::new(0).parse_all(binary) {
        let payload =
            payload.map_err(|e| RuntimeError::InvalidModule(format!("invalid component: {e}")))?;
        match payload {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentExportSection(exports) if depth == 0 => {
                for export in exports {
                    let export = export.map_err(|e| {
                        RuntimeError::InvalidModule(format!("invalid component: {e}"))
                    })?;
                    let name = export.name.name;
                    match export.kind {
                        ComponentExternalKind::Instance
                            if interface_of(name) == "wasi:http/incoming-handler" =>
                        {
                            http = true;
                        }
                        ComponentExternalKind::Instance if interface_of(name) == "wasi:cli/run" => {
                            command = true;
                        }
                        ComponentExternalKind::Func => funcs.push(name.to_owned()),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(if http {
        ComponentStyle::HttpHandler
    } else if command {
        ComponentStyle::Command
    } else if !funcs.is_empty() {
        ComponentStyle::TypedExports(funcs)
    } else {
        ComponentStyle::Nothing
    })
}

/// `wasi:cli/run` of `wasi:cli/run@0.2.3`: the interface without its version.
fn interface_of(name: &str) -> &str {
    name.split_once('@')
        .map_or(name, |(interface, _)| interface)
}

/// The refusal of a component at deploy: what it is, and that running components is not
/// built yet.
pub(crate) fn refusal(binary: &[u8]) -> RuntimeError {
    match classify(binary) {
        Ok(style) => RuntimeError::UnsupportedFeature(format!(
            "this is {}; running WebAssembly components (WASI 0.2) is not built yet \
             (docs/components.md): deploy a core module (WASI preview 1) instead",
            style.describe()
        )),
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(wat: &str) -> Vec<u8> {
        wat::parse_str(wat).expect("a component in the text format")
    }

    /// A component whose core module returns 0 from `run`, lifted as `wasi:cli/run`'s
    /// `run: func() -> result`.
    const COMMAND: &str = r#"(component
        (core module $m (func (export "run") (result i32) i32.const 0))
        (core instance $i (instantiate $m))
        (func $run (result (result)) (canon lift (core func $i "run")))
        (instance $cli (export "run" (func $run)))
        (export "wasi:cli/run@0.2.0" (instance $cli)))"#;

    #[test]
    fn components_are_classified_by_their_exports() {
        assert!(is_component(&component(COMMAND)));
        assert!(!is_component(&wat::parse_str("(module)").unwrap()));
        assert_eq!(
            classify(&component(COMMAND)).unwrap(),
            ComponentStyle::Command
        );
        let typed = component(
            r#"(component
                (core module $m (func (export "add") (param i32 i32) (result i32)
                    local.get 0 local.get 1 i32.add))
                (core instance $i (instantiate $m))
                (func $add (param "a" s32) (param "b" s32) (result s32)
                    (canon lift (core func $i "add")))
                (export "add" (func $add)))"#,
        );
        assert_eq!(
            classify(&typed).unwrap(),
            ComponentStyle::TypedExports(vec!["add".into()])
        );
        let handler = component(
            r#"(component
                (core module $m (func (export "handle")))
                (core instance $i (instantiate $m))
                (func $handle (canon lift (core func $i "handle")))
                (instance $h (export "handle" (func $handle)))
                (export "wasi:http/incoming-handler@0.2.3" (instance $h)))"#,
        );
        assert_eq!(classify(&handler).unwrap(), ComponentStyle::HttpHandler);
        assert_eq!(
            classify(&component("(component)")).unwrap(),
            ComponentStyle::Nothing
        );
    }

    #[test]
    fn a_component_is_refused_saying_what_it_is() {
        let err = refusal(&component(COMMAND)).to_string();
        assert!(err.contains("WASI 0.2 command"), "{err}");
        assert!(err.contains("not built yet"), "{err}");
        // Damaged after the header: invalid, not unsupported.
        let mut damaged = component(COMMAND);
        damaged.truncate(damaged.len() - 3);
        assert!(matches!(refusal(&damaged), RuntimeError::InvalidModule(_)));
    }
}
