//! Helpers of the shared store's tests.

use tensor_wasm_shared::BlobStoreConfig;

/// Object-store settings for tests that never touch blobs: they name a server that does not
/// exist (the client connects only when a blob is read or written).
pub fn no_blobs() -> BlobStoreConfig {
    BlobStoreConfig {
        url: "s3://unused".into(),
        endpoint: Some("http://127.0.0.1:9".into()),
        access_key_id: Some("unused".into()),
        secret_access_key: Some("unused".into()),
        region: Some("us-east-1".into()),
        allow_http: true,
    }
}
