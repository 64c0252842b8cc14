//! The `tensor-wasm` binary as a command-line tool, without a server: how it behaves
//! towards the shell.

use std::process::{Command, Stdio};

/// `tensor-wasm doctor | head -3`: the reader leaves before the output is written. The
/// command must end quietly (status 0, nothing on stderr), not panic on the closed pipe.
#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader); // every write to `writer` now fails with EPIPE
    let out = Command::new(env!("CARGO_BIN_EXE_tensor-wasm"))
        .arg("doctor")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "status {:?}, stderr: {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}
