//! `Fingerprint`: the stable 128-bit identity of emitted code (blueprint, target, emitter).

use std::fmt;

use sha2::{Digest, Sha256};

use crate::{Blueprint, PtxTarget, EMITTER_VERSION};

/// The first 16 bytes of SHA-256 over a canonical encoding; displayed as 32 lowercase hex
/// digits.
///
/// Canonical encoding, byte by byte:
///
/// ```text
/// "tensor-wasm-jit\0"                 16 bytes, domain tag
/// EMITTER_VERSION                     u32 little-endian
/// canonical descriptor                UTF-8 (Blueprint's Display, e.g. "conv2d[3x3,s1,p0]:f32")
/// 0x00                                terminator
/// 0x01 sm.0 sm.1 isa.0 isa.1          for one target: tag, then four u32 little-endian
///   or 0x00                           for the target-independent program identity
/// ```
///
/// Two blueprints with equal fingerprints for a target emit the same PTX for it; a change in
/// the emitter changes every fingerprint through [`EMITTER_VERSION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 16]);

impl Fingerprint {
    /// The fingerprint of `blueprint`'s PTX for `target`.
    pub fn of(blueprint: &Blueprint, target: &PtxTarget) -> Self {
        let mut bytes = canonical_prefix(blueprint);
        bytes.push(1);
        for value in [target.sm.0, target.sm.1, target.ptx_isa.0, target.ptx_isa.1] {
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        Self::of_bytes(&bytes)
    }

    /// The target-independent identity of `blueprint` under this emitter: the same for every
    /// device, for caches that are already per device.
    pub fn of_program(blueprint: &Blueprint) -> Self {
        let mut bytes = canonical_prefix(blueprint);
        bytes.push(0);
        Self::of_bytes(&bytes)
    }

    fn of_bytes(bytes: &[u8]) -> Self {
        let digest = Sha256::digest(bytes);
        let mut fingerprint = [0; 16];
        fingerprint.copy_from_slice(&digest[..16]);
        Self(fingerprint)
    }

    /// The 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

fn canonical_prefix(blueprint: &Blueprint) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(64);
    bytes.extend_from_slice(b"tensor-wasm-jit\0");
    bytes.extend_from_slice(&EMITTER_VERSION.to_le_bytes());
    bytes.extend_from_slice(blueprint.descriptor().as_bytes());
    bytes.push(0);
    bytes
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl Blueprint {
    /// [`Fingerprint::of`] this blueprint for `target`.
    pub fn fingerprint(&self, target: &PtxTarget) -> Fingerprint {
        Fingerprint::of(self, target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Committed values (computed independently from the documented encoding): a change here means emitted code changed identity. Update them only
    /// together with a bump of `EMITTER_VERSION` (or a deliberate change of the encoding).
    const GOLDEN: [(&str, &str, &str); 6] = [
        (
            "vector_add[4]:f32",
            "sm_80",
            "80aa3243b1a94ab5a6d6ccb0be7f2b8e",
        ),
        (
            "vector_add[16]:f32",
            "sm_90",
            "358dbaab1fde71a132b8a45622339fe0",
        ),
        (
            "elementwise[relu]:f32",
            "sm_80",
            "38ca2f77fe56aeaa0fbec476d3a7f201",
        ),
        (
            "reduce[sum]:i32",
            "sm_90",
            "360b61ce1c833e0ad1f99839d8c19b08",
        ),
        (
            "matmul[16x16x16]:f32",
            "sm_80",
            "f02b204a04e6c49b7aac02fcc13367c9",
        ),
        (
            "conv2d[3x3,s1,p1]:f32",
            "sm_90",
            "6a71a9f300fd86bcff2a8aef3d5a7ee3",
        ),
    ];

    fn target(sm: &str) -> PtxTarget {
        match sm {
            "sm_80" => PtxTarget::default(),
            _ => PtxTarget::for_device((9, 0), 13000).unwrap(),
        }
    }

    #[test]
    fn fingerprints_match_the_committed_values() {
        assert_eq!(
            EMITTER_VERSION, 1,
            "update GOLDEN when bumping the emitter version"
        );
        for (descriptor, sm, hex) in GOLDEN {
            let blueprint = Blueprint::parse(descriptor).unwrap();
            let fingerprint = blueprint.fingerprint(&target(sm));
            assert_eq!(fingerprint.to_string(), hex, "{descriptor} {sm}");
        }
    }

    #[test]
    fn fingerprints_separate_blueprints_targets_and_spellings() {
        let a = Blueprint::parse("conv2d[3x3]").unwrap();
        let b = Blueprint::parse("conv2d[3x3,s1,p0]:f32").unwrap();
        let c = Blueprint::parse("conv2d[3x3,s1,p0]:i32").unwrap();
        let sm80 = PtxTarget::default();
        let sm90 = target("sm_90");
        assert_eq!(a.fingerprint(&sm80), b.fingerprint(&sm80));
        assert_ne!(a.fingerprint(&sm80), c.fingerprint(&sm80));
        assert_ne!(a.fingerprint(&sm80), a.fingerprint(&sm90));
        assert_ne!(Fingerprint::of_program(&a), a.fingerprint(&sm80));
        assert_eq!(a.fingerprint(&sm80).to_string().len(), 32);
    }
}
