//! Snapshot metadata ([`SnapshotMeta`]), restore limits and the bincode codec for the
//! metadata section. The memory image never passes through the serializer.

use serde::{Deserialize, Serialize};

use crate::SnapshotError;

/// The snapshot format version this build writes and the only one it reads.
pub const FORMAT_VERSION: u32 = 1;

/// Hard upper bound on the encoded metadata section, whatever [`RestoreLimits`] say.
pub const META_HARD_LIMIT: usize = 16 << 20;

/// Everything about a snapshot except its memory image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// Must equal [`FORMAT_VERSION`]; also checked against the header on restore.
    pub format_version: u32,
    /// SHA-256 of the Wasm module the memory belongs to. Restores check it against the
    /// module the caller is about to instantiate ([`SnapshotError::ModuleMismatch`]).
    pub module_sha256: [u8; 32],
    /// Identifier of the function (as registered with the runtime).
    pub function_id: String,
    /// Tenant that owns the function.
    pub tenant: String,
    /// Capture time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Length of linear memory 0 in bytes; must equal the image length.
    pub memory_size_bytes: u64,
    /// Wasm page size of that memory (65 536 unless the custom-page-sizes proposal is used).
    /// A power of two that divides `memory_size_bytes`.
    pub page_size: u32,
    /// Values of the instance's mutable globals at capture time.
    pub globals: Vec<GlobalValue>,
    /// Table contents. Version 1 writers leave this empty: the runtime re-instantiates the
    /// module, whose element segments rebuild the tables; the field exists so that a later
    /// writer can record tables mutated at run time without a format change.
    pub tables: Vec<TableSnapshot>,
}

impl SnapshotMeta {
    /// Metadata for a memory of `memory_size_bytes` with 64 KiB Wasm pages, no globals and no
    /// tables, created now.
    #[must_use]
    pub fn new(
        module_sha256: [u8; 32],
        function_id: impl Into<String>,
        tenant: impl Into<String>,
        memory_size_bytes: u64,
    ) -> Self {
        let created_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self {
            format_version: FORMAT_VERSION,
            module_sha256,
            function_id: function_id.into(),
            tenant: tenant.into(),
            created_at_ms,
            memory_size_bytes,
            page_size: 65_536,
            globals: Vec::new(),
            tables: Vec::new(),
        }
    }
}

/// The value of one global, stored as raw bits so that NaN payloads survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalValue {
    /// Global index in the module's global index space.
    pub index: u32,
    /// Value type.
    pub ty: ValType,
    /// Raw bits, zero-extended: `i32`/`f32` in the low 32 bits, `i64`/`f64` in the low 64,
    /// `v128` in all 128. Reference globals are not captured in version 1.
    pub bits: u128,
}

/// Value types a captured global may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValType {
    /// 32-bit integer.
    I32,
    /// 64-bit integer.
    I64,
    /// 32-bit float (bits).
    F32,
    /// 64-bit float (bits).
    F64,
    /// 128-bit vector.
    V128,
}

/// Contents of one table, as function indices (`None` = null reference).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableSnapshot {
    /// Table index.
    pub index: u32,
    /// One entry per table slot.
    pub elements: Vec<Option<u32>>,
}

/// Bounds a restore checks declared sizes against before allocating anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreLimits {
    /// Largest memory image accepted, in bytes. A restore allocates at most this much for the
    /// image (plus, for local images, a run table of at most 12 bytes per image page).
    pub max_memory_bytes: u64,
    /// Largest encoded metadata section accepted, in bytes (capped by [`META_HARD_LIMIT`]).
    pub max_meta_bytes: u32,
}

impl Default for RestoreLimits {
    /// 4 GiB of memory (the wasm32 maximum) and 1 MiB of metadata.
    fn default() -> Self {
        Self {
            max_memory_bytes: 4 << 30,
            max_meta_bytes: 1 << 20,
        }
    }
}

impl RestoreLimits {
    pub(crate) fn check_memory(&self, declared: u64) -> Result<(), SnapshotError> {
        if declared > self.max_memory_bytes {
            return Err(SnapshotError::TooLarge {
                what: "memory image",
                found: declared,
                limit: self.max_memory_bytes,
            });
        }
        // The image must also be addressable on this host.
        usize::try_from(declared).map_err(|_| SnapshotError::TooLarge {
            what: "memory image",
            found: declared,
            limit: usize::MAX as u64,
        })?;
        Ok(())
    }

    pub(crate) fn check_meta(&self, declared: u64) -> Result<(), SnapshotError> {
        let limit = u64::from(self.max_meta_bytes).min(META_HARD_LIMIT as u64);
        if declared > limit {
            return Err(SnapshotError::TooLarge {
                what: "metadata section",
                found: declared,
                limit,
            });
        }
        Ok(())
    }
}

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<META_HARD_LIMIT>()
}

/// Encodes metadata with bincode 2 (standard configuration: little-endian, varints).
pub(crate) fn encode_meta(meta: &SnapshotMeta) -> Result<Vec<u8>, SnapshotError> {
    let bytes = bincode::serde::encode_to_vec(meta, bincode_config())
        .map_err(|e| SnapshotError::InvalidInput(format!("metadata does not encode: {e}")))?;
    if bytes.len() > META_HARD_LIMIT {
        return Err(SnapshotError::TooLarge {
            what: "metadata section",
            found: bytes.len() as u64,
            limit: META_HARD_LIMIT as u64,
        });
    }
    Ok(bytes)
}

/// Decodes a metadata section that must consist of exactly one encoded [`SnapshotMeta`].
pub(crate) fn decode_meta(bytes: &[u8]) -> Result<SnapshotMeta, SnapshotError> {
    let (meta, used): (SnapshotMeta, usize) =
        bincode::serde::decode_from_slice(bytes, bincode_config())
            .map_err(|e| SnapshotError::Corrupt(format!("metadata does not decode: {e}")))?;
    if used != bytes.len() {
        return Err(SnapshotError::Corrupt(format!(
            "metadata section has {} trailing bytes",
            bytes.len() - used
        )));
    }
    Ok(meta)
}

/// Checks decoded metadata against the header and the caller's expectations.
pub(crate) fn check_meta_consistency(
    meta: &SnapshotMeta,
    header_memory_size: u64,
    expected_module_sha256: &[u8; 32],
) -> Result<(), SnapshotError> {
    if meta.format_version != FORMAT_VERSION {
        return Err(SnapshotError::Corrupt(format!(
            "metadata says format version {} but the header says {FORMAT_VERSION}",
            meta.format_version
        )));
    }
    if meta.memory_size_bytes != header_memory_size {
        return Err(SnapshotError::Corrupt(format!(
            "metadata says {} memory bytes but the header says {header_memory_size}",
            meta.memory_size_bytes
        )));
    }
    check_page_size(meta)?;
    if &meta.module_sha256 != expected_module_sha256 {
        return Err(SnapshotError::ModuleMismatch);
    }
    Ok(())
}

pub(crate) fn check_page_size(meta: &SnapshotMeta) -> Result<(), SnapshotError> {
    if !meta.page_size.is_power_of_two()
        || !meta
            .memory_size_bytes
            .is_multiple_of(u64::from(meta.page_size))
    {
        return Err(SnapshotError::Corrupt(format!(
            "page size {} is not a power of two dividing the memory size {}",
            meta.page_size, meta.memory_size_bytes
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_through_bincode() {
        let mut meta = SnapshotMeta::new([7; 32], "f", "t", 65_536);
        meta.globals.push(GlobalValue {
            index: 3,
            ty: ValType::F64,
            bits: u128::from(f64::NAN.to_bits()),
        });
        meta.tables.push(TableSnapshot {
            index: 0,
            elements: vec![Some(1), None],
        });
        let bytes = encode_meta(&meta).unwrap();
        assert_eq!(decode_meta(&bytes).unwrap(), meta);
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let meta = SnapshotMeta::new([7; 32], "f", "t", 0);
        let mut bytes = encode_meta(&meta).unwrap();
        bytes.push(0);
        assert!(matches!(
            decode_meta(&bytes),
            Err(SnapshotError::Corrupt(_))
        ));
    }

    #[test]
    fn huge_declared_vec_is_refused_without_allocating() {
        // function_id length varint claiming 2^60 bytes.
        let mut bytes = vec![1u8]; // format_version = 1
        bytes.extend_from_slice(&[0u8; 32]);
        bytes.push(255); // u64 varint marker
        bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(decode_meta(&bytes).is_err());
    }
}
