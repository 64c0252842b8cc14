//! Bearer tokens: random secrets, their SHA-256 hashes, ids, and the
//! constant-time comparison used to confirm a match.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::TenantError;

/// Prefix of every token secret.
pub const SECRET_PREFIX: &str = "twt_";

/// Length of a secret: the prefix and 43 base64url characters (32 bytes).
pub const SECRET_LEN: usize = SECRET_PREFIX.len() + 43;

/// What is known about a token, without its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenInfo {
    /// `tk-` and 12 lowercase hex digits.
    pub id: String,
    /// Free text given at creation.
    pub label: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Whether the token was revoked (it no longer authenticates).
    pub revoked: bool,
}

/// A token just created, with its secret: the only time the secret is shown.
#[derive(Clone)]
pub struct NewToken {
    /// The token's public description.
    pub info: TokenInfo,
    /// `twt_` and 43 base64url characters encoding 32 random bytes.
    pub secret: String,
}

impl std::fmt::Debug for NewToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewToken")
            .field("info", &self.info)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// SHA-256 of a secret, the only form in which tokens are kept.
pub(crate) type SecretHash = [u8; 32];

pub(crate) fn hash_secret(secret: &str) -> SecretHash {
    Sha256::digest(secret.as_bytes()).into()
}

/// Parses the hex form of a hash as stored in records.
pub(crate) fn parse_hash(hex_hash: &str) -> Option<SecretHash> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_hash, &mut out).ok()?;
    Some(out)
}

/// Compares two byte strings in time that depends only on their lengths, not
/// on where they first differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], TenantError> {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf)
        .map_err(|e| TenantError::Random(std::io::Error::other(e.to_string())))?;
    Ok(buf)
}

/// A fresh secret: the prefix and 32 random bytes in unpadded base64url.
pub(crate) fn new_secret() -> Result<String, TenantError> {
    let bytes = random_bytes::<32>()?;
    let mut secret = String::with_capacity(SECRET_LEN);
    secret.push_str(SECRET_PREFIX);
    base64url(&bytes, &mut secret);
    Ok(secret)
}

/// A fresh token id: `tk-` and 12 lowercase hex digits.
pub(crate) fn new_token_id() -> Result<String, TenantError> {
    Ok(format!("tk-{}", hex::encode(random_bytes::<6>()?)))
}

/// A fresh tenant id: `tn-` and 16 lowercase hex digits.
pub(crate) fn new_tenant_id() -> Result<String, TenantError> {
    Ok(format!("tn-{}", hex::encode(random_bytes::<8>()?)))
}

/// Appends `bytes` to `out` in unpadded base64url (RFC 4648 §5).
fn base64url(bytes: &[u8], out: &mut String) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
        let chars = chunk.len() + 1;
        for i in 0..chars {
            let index = (n >> (18 - 6 * i)) & 0x3f;
            out.push(char::from(ALPHABET[index as usize]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        let mut s = String::new();
        base64url(bytes, &mut s);
        s
    }

    #[test]
    fn base64url_matches_rfc4648_vectors() {
        assert_eq!(b64(b""), "");
        assert_eq!(b64(b"f"), "Zg");
        assert_eq!(b64(b"fo"), "Zm8");
        assert_eq!(b64(b"foo"), "Zm9v");
        assert_eq!(b64(b"foob"), "Zm9vYg");
        assert_eq!(b64(b"fooba"), "Zm9vYmE");
        assert_eq!(b64(b"foobar"), "Zm9vYmFy");
        assert_eq!(b64(&[0xfb, 0xff]), "-_8");
    }

    #[test]
    fn secrets_have_the_documented_shape_and_differ() {
        let a = new_secret().unwrap();
        let b = new_secret().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), SECRET_LEN);
        assert!(a.starts_with(SECRET_PREFIX));
        assert!(a[SECRET_PREFIX.len()..]
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
    }

    #[test]
    fn ids_have_the_documented_shape() {
        let tk = new_token_id().unwrap();
        assert_eq!(tk.len(), 15);
        assert!(tk.starts_with("tk-"));
        assert!(tk[3..]
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        assert!(crate::is_valid_tenant_id(&new_tenant_id().unwrap()));
    }

    #[test]
    fn constant_time_eq_compares_content_and_length() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"xbc"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"abcd", b"abc"));
        let h = hash_secret("x");
        let mut other = h;
        other[31] ^= 1;
        assert!(constant_time_eq(&h, &h));
        assert!(!constant_time_eq(&h, &other));
    }

    #[test]
    fn hashes_round_trip_through_hex() {
        let h = hash_secret("twt_example");
        assert_eq!(parse_hash(&hex::encode(h)), Some(h));
        assert_eq!(parse_hash("zz"), None);
        assert_eq!(parse_hash(&hex::encode([0u8; 31])), None);
    }

    #[test]
    fn debug_of_new_token_hides_the_secret() {
        let token = NewToken {
            info: TokenInfo {
                id: "tk-000000000000".into(),
                label: String::new(),
                created_at_ms: 0,
                revoked: false,
            },
            secret: "twt_supersecret".into(),
        };
        assert!(!format!("{token:?}").contains("supersecret"));
    }
}
