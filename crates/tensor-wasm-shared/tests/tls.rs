//! TLS to PostgreSQL against a real PostgreSQL 15 with TLS on and a certificate of a CA made
//! here (with the `openssl` command): `sslmode=require` connects over TLS and verifies the
//! server against `sslrootcert`; an unknown CA, a host name the certificate does not name, a
//! server without TLS and `sslrootcert` without `sslmode=require` are refused with clear
//! errors.

mod common;

use std::path::Path;
use std::process::Command;

use tensor_wasm_shared::SharedStore;
use tensor_wasm_test_support::servers::Postgres;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for the address 127.0.0.1 (and no host name) signed by it.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=tensor-wasm test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

#[test]
fn the_store_connects_to_postgresql_over_verified_tls() {
    let pg = Postgres::start();
    let url = pg.create_database("tls");
    let certs = tempfile::tempdir().unwrap();
    certificates(certs.path());
    let ca = certs.path().join("ca.crt");
    let with = |query: &str| format!("{url}?{query}");
    let refused = |url: &str| {
        SharedStore::connect(url, &common::no_blobs())
            .unwrap_err()
            .to_string()
    };

    // A server without TLS: `require` is refused, the default stays plain.
    let err = refused(&with(&format!(
        "sslmode=require&sslrootcert={}",
        ca.display()
    )));
    assert!(err.contains("TLS"), "{err}");
    SharedStore::connect(&url, &common::no_blobs()).expect("a plain connection");

    pg.enable_tls(
        &certs.path().join("server.crt"),
        &certs.path().join("server.key"),
    );
    let store = SharedStore::connect(
        &with(&format!("sslmode=require&sslrootcert={}", ca.display())),
        &common::no_blobs(),
    )
    .expect("a verified TLS connection");
    store.latest_change().expect("a query over TLS");
    // The store's session is encrypted (psql's own session is left out by its name).
    let encrypted = pg.query(
        "tls",
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE s.ssl AND a.datname = 'tls' AND a.application_name <> 'psql'",
    );
    assert_ne!(encrypted, vec!["0"], "the store's connection uses TLS");

    // The system's roots do not know this CA.
    let err = refused(&with("sslmode=require"));
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // A name the certificate does not carry.
    let by_name = url.replace("127.0.0.1", "localhost");
    let err = refused(&format!(
        "{by_name}?sslmode=require&sslrootcert={}",
        ca.display()
    ));
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // A CA file without TLS asked for, or one that does not exist.
    let err = refused(&with(&format!("sslrootcert={}", ca.display())));
    assert!(err.contains("sslrootcert needs sslmode=require"), "{err}");
    let err = refused(&with("sslmode=require&sslrootcert=/nonexistent/ca.pem"));
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
}
