//! Compile-time instrumentation that makes an instance's state reachable from the host.
//!
//! wasmtime only lets the embedder read and write *exported* globals and memories. A
//! snapshot must capture every mutable global (a C or Rust module keeps its stack pointer
//! in one) and linear memory 0 even when the module exports neither, so before a module is
//! compiled its export section is extended with host-only names:
//!
//! - `tensor-wasm:global:<index>` for every mutable global the module defines;
//! - `tensor-wasm:memory` for memory 0 when the module defines it.
//!
//! Exporting an item does not change what the guest computes, only what the host can see;
//! the stored module (and its sha256) stays the one the tenant deployed. Names in the
//! `tensor-wasm:` namespace are reserved: a module that exports such a name is refused.

use std::ops::Range;

use wasmparser::{ExternalKind, Operator, Parser, Payload, TypeRef};

/// Prefix of every export name the instrumentation adds.
pub(crate) const RESERVED_PREFIX: &str = "tensor-wasm:";
/// Export name prefix of instrumented mutable globals; the global index follows.
pub(crate) const GLOBAL_PREFIX: &str = "tensor-wasm:global:";
/// Export name of memory 0.
pub(crate) const MEMORY_EXPORT: &str = "tensor-wasm:memory";
/// Bumped whenever the instrumentation changes what it adds, so that precompiled artifacts
/// of an older instrumentation are not reused.
pub(crate) const INSTRUMENTATION_VERSION: u32 = 1;

const EXPORT_SECTION: u8 = 7;
/// Section ids that must come after the export section (start, element, data count, code,
/// data), in binary order.
const AFTER_EXPORTS: [u8; 5] = [8, 9, 12, 10, 11];

/// Whether `name` belongs to the reserved host namespace.
pub(crate) fn is_reserved(name: &str) -> bool {
    name.starts_with(RESERVED_PREFIX)
}

/// Returns `binary` with the state exports added (see the module docs).
///
/// # Errors
/// A message when the binary cannot be parsed or already uses a reserved name.
pub(crate) fn export_state(binary: &[u8]) -> Result<Vec<u8>, String> {
    let mut imported_globals = 0u32;
    let mut imported_memories = 0u32;
    let mut defined_memories = 0u32;
    let mut mutable_globals = Vec::new();
    let mut export_count = 0u32;
    for payload in Parser::new(0).parse_all(binary) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    match import.map_err(|e| e.to_string())?.ty {
                        TypeRef::Global(_) => imported_globals += 1,
                        TypeRef::Memory(_) => imported_memories += 1,
                        _ => {}
                    }
                }
            }
            Payload::MemorySection(reader) => defined_memories += reader.count(),
            Payload::GlobalSection(reader) => {
                for (i, global) in reader.into_iter().enumerate() {
                    let global = global.map_err(|e| e.to_string())?;
                    if global.ty.mutable {
                        mutable_globals.push(imported_globals + i as u32);
                    }
                }
            }
            Payload::ExportSection(reader) => {
                export_count = reader.count();
                for export in reader {
                    let export = export.map_err(|e| e.to_string())?;
                    if is_reserved(export.name) {
                        return Err(format!(
                            "export `{}` uses the reserved `{RESERVED_PREFIX}` namespace",
                            export.name
                        ));
                    }
                }
            }
            Payload::ComponentSection { .. } | Payload::ModuleSection { .. } => {
                return Err("components are not supported; deploy a core module".into());
            }
            _ => {}
        }
    }

    let mut added = Vec::new();
    for index in &mutable_globals {
        push_export(&mut added, &format!("{GLOBAL_PREFIX}{index}"), 0x03, *index);
    }
    let memory_zero_defined = imported_memories == 0 && defined_memories > 0;
    if memory_zero_defined {
        push_export(&mut added, MEMORY_EXPORT, 0x02, 0);
    }
    let added_count = mutable_globals.len() as u32 + u32::from(memory_zero_defined);
    if added_count == 0 {
        return Ok(binary.to_vec());
    }

    let sections = sections(binary)?;
    let mut out = Vec::with_capacity(binary.len() + added.len() + 16);
    out.extend_from_slice(&binary[..8]);
    let mut inserted = false;
    for section in &sections {
        if !inserted && section.id == EXPORT_SECTION {
            let mut content = Vec::with_capacity(section.content.len() + added.len() + 5);
            let (_, count_len) = read_leb_u32(&binary[section.content.clone()])?;
            write_leb_u32(&mut content, export_count + added_count);
            content
                .extend_from_slice(&binary[section.content.start + count_len..section.content.end]);
            content.extend_from_slice(&added);
            write_section(&mut out, EXPORT_SECTION, &content);
            inserted = true;
            continue;
        }
        if !inserted && AFTER_EXPORTS.contains(&section.id) {
            let mut content = Vec::with_capacity(added.len() + 5);
            write_leb_u32(&mut content, added_count);
            content.extend_from_slice(&added);
            write_section(&mut out, EXPORT_SECTION, &content);
            inserted = true;
        }
        out.extend_from_slice(&binary[section.whole.clone()]);
    }
    if !inserted {
        let mut content = Vec::with_capacity(added.len() + 5);
        write_leb_u32(&mut content, added_count);
        content.extend_from_slice(&added);
        write_section(&mut out, EXPORT_SECTION, &content);
    }
    Ok(out)
}

/// The first instruction in `binary` that changes a table at run time, if any, as a
/// description ("`table.set` in function 3"). Snapshots do not record tables (format
/// version 1), so such modules cannot be snapshotted.
///
/// # Errors
/// A message when the binary cannot be parsed.
pub(crate) fn table_mutation(binary: &[u8]) -> Result<Option<String>, String> {
    let mut imported_funcs = 0u32;
    let mut body_index = 0u32;
    for payload in Parser::new(0).parse_all(binary) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    if matches!(
                        import.map_err(|e| e.to_string())?.ty,
                        TypeRef::Func(_) | TypeRef::FuncExact(_)
                    ) {
                        imported_funcs += 1;
                    }
                }
            }
            Payload::CodeSectionEntry(body) => {
                let mut ops = body.get_operators_reader().map_err(|e| e.to_string())?;
                while !ops.eof() {
                    let name = match ops.read().map_err(|e| e.to_string())? {
                        Operator::TableSet { .. } => "table.set",
                        Operator::TableGrow { .. } => "table.grow",
                        Operator::TableFill { .. } => "table.fill",
                        Operator::TableCopy { .. } => "table.copy",
                        Operator::TableInit { .. } => "table.init",
                        _ => continue,
                    };
                    return Ok(Some(format!(
                        "`{name}` in function {}",
                        imported_funcs + body_index
                    )));
                }
                body_index += 1;
            }
            Payload::ExportSection(reader) => {
                for export in reader {
                    if export.map_err(|e| e.to_string())?.kind == ExternalKind::Table {
                        // The host never writes tables, but an exported table could be
                        // shared with one that does in a later version: stay conservative.
                        return Ok(Some("an exported table".into()));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(None)
}

struct Section {
    id: u8,
    whole: Range<usize>,
    content: Range<usize>,
}

/// Top-level sections of a module binary, after its 8-byte preamble.
fn sections(binary: &[u8]) -> Result<Vec<Section>, String> {
    if binary.len() < 8 {
        return Err("module binary is shorter than its preamble".into());
    }
    let mut sections = Vec::new();
    let mut at = 8;
    while at < binary.len() {
        let id = binary[at];
        let (size, len) = read_leb_u32(&binary[at + 1..])?;
        let start = at + 1 + len;
        let end = start
            .checked_add(size as usize)
            .filter(|end| *end <= binary.len())
            .ok_or("a section runs past the end of the module")?;
        sections.push(Section {
            id,
            whole: at..end,
            content: start..end,
        });
        at = end;
    }
    Ok(sections)
}

fn read_leb_u32(bytes: &[u8]) -> Result<(u32, usize), String> {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().take(5).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return u32::try_from(value)
                .map(|v| (v, i + 1))
                .map_err(|_| "a LEB128 value overflows u32".into());
        }
    }
    Err("a LEB128 value is truncated or too long".into())
}

fn write_leb_u32(out: &mut Vec<u8>, mut value: u32) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn push_export(out: &mut Vec<u8>, name: &str, kind: u8, index: u32) {
    write_leb_u32(out, name.len() as u32);
    out.extend_from_slice(name.as_bytes());
    out.push(kind);
    write_leb_u32(out, index);
}

fn write_section(out: &mut Vec<u8>, id: u8, content: &[u8]) {
    out.push(id);
    write_leb_u32(out, content.len() as u32);
    out.extend_from_slice(content);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exports(binary: &[u8]) -> Vec<(String, ExternalKind, u32)> {
        let mut out = Vec::new();
        for payload in Parser::new(0).parse_all(binary) {
            if let Payload::ExportSection(reader) = payload.unwrap() {
                for e in reader {
                    let e = e.unwrap();
                    out.push((e.name.to_owned(), e.kind, e.index));
                }
            }
        }
        out
    }

    #[test]
    fn adds_mutable_globals_and_memory_and_keeps_the_module_valid() {
        let wat = r#"(module
            (import "wasi:cuda" "x" (func))
            (memory 1)
            (global $a (mut i32) (i32.const 1))
            (global $b i64 (i64.const 2))
            (global $c (mut f64) (f64.const 3))
            (func (export "f") (result i32) global.get $a)
            (data (i32.const 0) "hi"))"#;
        let binary = wat::parse_str(wat).unwrap();
        let out = export_state(&binary).unwrap();
        wasmparser::Validator::new().validate_all(&out).unwrap();
        assert_eq!(
            exports(&out),
            vec![
                ("f".to_owned(), ExternalKind::Func, 1),
                ("tensor-wasm:global:0".to_owned(), ExternalKind::Global, 0),
                ("tensor-wasm:global:2".to_owned(), ExternalKind::Global, 2),
                ("tensor-wasm:memory".to_owned(), ExternalKind::Memory, 0),
            ]
        );
    }

    #[test]
    fn creates_an_export_section_in_the_right_place() {
        // No exports at all, but code and data sections after where exports belong.
        let wat = r#"(module (memory 1) (global (mut i32) (i32.const 0))
            (func) (start 0) (data (i32.const 0) "x"))"#;
        let binary = wat::parse_str(wat).unwrap();
        let out = export_state(&binary).unwrap();
        wasmparser::Validator::new().validate_all(&out).unwrap();
        assert_eq!(exports(&out).len(), 2);
    }

    #[test]
    fn modules_without_state_are_unchanged() {
        let binary = wat::parse_str(r#"(module (func (export "f")))"#).unwrap();
        assert_eq!(export_state(&binary).unwrap(), binary);
    }

    #[test]
    fn reserved_names_are_refused() {
        let binary = wat::parse_str(r#"(module (func (export "tensor-wasm:memory")))"#).unwrap();
        assert!(export_state(&binary).unwrap_err().contains("reserved"));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [
            &b""[..],
            b"\0asm",
            b"\0asm\x01\0\0\0\x07\xff\xff",
            b"\0asm\x01\0\0\0\x01",
        ] {
            let _ = export_state(bytes);
            let _ = table_mutation(bytes);
        }
    }

    #[test]
    fn table_mutations_are_found() {
        let plain = wat::parse_str(
            r#"(module (table 1 funcref) (func $f) (elem (i32.const 0) $f)
                (func (export "g") i32.const 0 call_indirect))"#,
        )
        .unwrap();
        assert_eq!(table_mutation(&plain).unwrap(), None);
        let mutating = wat::parse_str(
            r#"(module (table 1 funcref) (func $f)
                (func (export "g") i32.const 0 ref.null func table.set 0))"#,
        )
        .unwrap();
        assert_eq!(
            table_mutation(&mutating).unwrap().as_deref(),
            Some("`table.set` in function 1")
        );
    }
}
