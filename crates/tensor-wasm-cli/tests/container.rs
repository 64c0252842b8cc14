//! The container image's contract, without a container engine: the binary is
//! run exactly as the image runs it. `ENTRYPOINT`, `ENV`, `WORKDIR`,
//! `HEALTHCHECK` and `STOPSIGNAL` are read from the repository's Dockerfile
//! (its last stage), so this test and the image cannot drift apart. The only
//! substitutions: this build's binary for `tensor-wasm`, a temporary directory
//! for `/data`, and a free port for 8080 (still on 0.0.0.0, reached through
//! 127.0.0.1).
//!
//! Also checks that docs/deploy.md's generated configuration and metrics
//! reference is current (scripts/gen_config_reference.py --check).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tensor_wasm_test_support::wait::poll_for;

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");
/// The image's data dir, replaced by a temporary directory here.
const IMAGE_DATA_DIR: &str = "/data";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What the runtime image declares, from the Dockerfile's last stage.
#[derive(Debug, Default)]
struct Image {
    entrypoint: Vec<String>,
    env: BTreeMap<String, String>,
    workdir: Option<String>,
    healthcheck: Vec<String>,
    stop_signal: Option<String>,
    exposed: Vec<String>,
    binary_copies: Vec<String>,
}

/// Instructions with line continuations joined and comments dropped.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(head) = line.trim_end().strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let full = std::mem::take(&mut pending);
        let full = full.trim();
        if full.is_empty() {
            continue;
        }
        let (keyword, rest) = full.split_once(char::is_whitespace).unwrap_or((full, ""));
        out.push((keyword.to_ascii_uppercase(), rest.trim().to_owned()));
    }
    out
}

/// `K=V K2="V 2"` pairs of an ENV instruction.
fn env_pairs(rest: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            value.extend(chars.by_ref().take_while(|&c| c != '"'));
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        assert!(
            !key.contains(char::is_whitespace),
            "ENV in the legacy `ENV K V` form is not supported: {rest}"
        );
        pairs.push((key, value));
    }
    pairs
}

fn json_array(text: &str, what: &str) -> Vec<String> {
    serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{what} must be in JSON (exec) form, got {text:?}: {e}"))
}

fn parse_dockerfile(text: &str) -> Image {
    let mut image = Image::default();
    for (keyword, rest) in instructions(text) {
        match keyword.as_str() {
            "FROM" => image = Image::default(),
            "ENTRYPOINT" => image.entrypoint = json_array(&rest, "ENTRYPOINT"),
            "ENV" => image.env.extend(env_pairs(&rest)),
            "WORKDIR" => image.workdir = Some(rest),
            "STOPSIGNAL" => image.stop_signal = Some(rest),
            "EXPOSE" => image
                .exposed
                .extend(rest.split_whitespace().map(str::to_owned)),
            "COPY" => image.binary_copies.push(rest),
            "HEALTHCHECK" => {
                let mut words = rest.as_str();
                while let Some(option) = words.strip_prefix("--") {
                    words = option
                        .split_once(char::is_whitespace)
                        .map_or("", |(_, r)| r)
                        .trim_start();
                }
                let cmd = words
                    .strip_prefix("CMD")
                    .unwrap_or_else(|| panic!("HEALTHCHECK without CMD: {rest}"))
                    .trim();
                image.healthcheck = if cmd.starts_with('[') {
                    json_array(cmd, "HEALTHCHECK CMD")
                } else {
                    vec!["/bin/sh".into(), "-c".into(), cmd.to_owned()]
                };
            }
            _ => {}
        }
    }
    image
}

fn image() -> Image {
    let path = repo_root().join("Dockerfile");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    parse_dockerfile(&text)
}

fn free_port() -> u16 {
    TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The substitutions that turn the image's world into this test's.
struct Subst {
    data_dir: PathBuf,
    image_port: String,
    port: u16,
}

impl Subst {
    fn apply(&self, value: &str) -> String {
        let mut out = value.to_owned();
        if out == IMAGE_DATA_DIR || out.starts_with(&format!("{IMAGE_DATA_DIR}/")) {
            out = format!(
                "{}{}",
                self.data_dir.display(),
                &out[IMAGE_DATA_DIR.len()..]
            );
        }
        out.replace(&format!(":{}", self.image_port), &format!(":{}", self.port))
    }

    fn env(&self, image: &Image) -> Vec<(String, String)> {
        image
            .env
            .iter()
            .map(|(k, v)| (k.clone(), self.apply(v)))
            .collect()
    }
}

/// A command with the test's environment cleared of TENSOR_WASM_* settings
/// (they would leak into the run) and the image's environment applied.
fn command(program: &str, subst: &Subst, image: &Image) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("TENSOR_WASM_") {
            cmd.env_remove(key);
        }
    }
    cmd.envs(subst.env(image));
    cmd
}

fn run_healthcheck(image: &Image, subst: &Subst, quiet: bool) -> ExitStatus {
    let argv: Vec<String> = image.healthcheck.iter().map(|a| subst.apply(a)).collect();
    let program = if argv[0] == "tensor-wasm" {
        BIN.to_owned()
    } else {
        argv[0].clone()
    };
    command(&program, subst, image)
        .args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(if quiet {
            Stdio::null()
        } else {
            Stdio::inherit()
        })
        .status()
        .unwrap_or_else(|e| panic!("running the HEALTHCHECK {argv:?}: {e}"))
}

fn signal_name(stop_signal: &str) -> String {
    let name = stop_signal.trim().to_ascii_uppercase();
    name.strip_prefix("SIG").unwrap_or(&name).to_owned()
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    poll_for(timeout, || child.try_wait().unwrap())
}

fn http_get(url: &str) -> Result<u16, String> {
    match ureq::get(url).timeout(Duration::from_secs(5)).call() {
        Ok(r) => Ok(r.status()),
        Err(ureq::Error::Status(code, _)) => Ok(code),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn dockerfile_declares_the_runtime_contract() {
    let image = image();
    assert_eq!(
        image.entrypoint.first().map(String::as_str),
        Some("tensor-wasm"),
        "ENTRYPOINT runs the tensor-wasm binary"
    );
    assert_eq!(image.entrypoint.get(1).map(String::as_str), Some("serve"));
    assert!(
        image
            .binary_copies
            .iter()
            .any(|c| c.ends_with("/usr/local/bin/tensor-wasm")),
        "the runtime stage copies the binary onto PATH: {:?}",
        image.binary_copies
    );
    let env = &image.env;
    assert_eq!(env["TENSOR_WASM_LISTEN"], "0.0.0.0:8080");
    assert_eq!(env["TENSOR_WASM_DATA_DIR"], IMAGE_DATA_DIR);
    assert_eq!(env["TENSOR_WASM_LOG_FORMAT"], "json");
    let port = env["TENSOR_WASM_LISTEN"].rsplit(':').next().unwrap();
    assert!(
        image
            .exposed
            .iter()
            .any(|p| p.split('/').next() == Some(port)),
        "EXPOSE {port} (exposed: {:?})",
        image.exposed
    );
    assert!(!image.healthcheck.is_empty(), "HEALTHCHECK CMD");
    assert_eq!(
        image.stop_signal.as_deref().map(signal_name).as_deref(),
        Some("TERM")
    );
}

#[test]
fn binary_runs_as_the_image_runs_it() {
    let image = image();
    let scratch = tempfile::tempdir().unwrap();
    let data_dir = scratch.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    let log_path = scratch.path().join("server.log");
    let image_listen = image.env["TENSOR_WASM_LISTEN"].clone();
    let (image_host, image_port) = image_listen.rsplit_once(':').unwrap();
    let subst = Subst {
        data_dir: data_dir.clone(),
        image_port: image_port.to_owned(),
        port: free_port(),
    };
    let listen = subst.apply(&image_listen);
    assert_eq!(listen, format!("{image_host}:{}", subst.port));

    let workdir = image
        .workdir
        .as_deref()
        .map(|w| PathBuf::from(subst.apply(w)))
        .unwrap_or_else(|| scratch.path().to_owned());
    let mut child = command(BIN, &subst, &image)
        .args(image.entrypoint[1..].iter().map(|a| subst.apply(a)))
        .current_dir(&workdir)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("starting the image's entrypoint");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    // The machine-readable first line, then /healthz through loopback.
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line.trim(),
        format!("tensor-wasm listening on http://{listen}"),
        "server log:\n{}",
        log()
    );
    let health = format!("http://127.0.0.1:{}/healthz", subst.port);
    let mut last = None;
    let healthy = poll_for(Duration::from_secs(30), || {
        let answer = http_get(&health);
        let ok = answer == Ok(200);
        last = Some(answer);
        ok.then_some(())
    });
    if healthy.is_none() {
        let _ = child.kill();
        panic!("{health}: {last:?}\nserver log:\n{}", log());
    }

    // State lands in the data dir: the first-start credentials, mode 0600.
    let credentials = data_dir.join("credentials.json");
    let body: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&credentials)
            .unwrap_or_else(|e| panic!("{}: {e}\nserver log:\n{}", credentials.display(), log())),
    )
    .unwrap();
    assert!(body["admin_token"].as_str().is_some_and(|t| !t.is_empty()));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&credentials)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "credentials.json mode");
    }
    // The log format the image asks for: JSON lines.
    let first_log = log().lines().next().unwrap_or_default().to_owned();
    assert!(
        serde_json::from_str::<serde_json::Value>(&first_log).is_ok(),
        "TENSOR_WASM_LOG_FORMAT=json gives JSON log lines, got {first_log:?}"
    );

    // The image's HEALTHCHECK passes against the running server.
    let status = run_healthcheck(&image, &subst, false);
    assert!(
        status.success(),
        "HEALTHCHECK {:?}: {status}",
        image.healthcheck
    );

    // STOPSIGNAL: a graceful exit with status 0 within the grace period.
    let grace_s: u64 = image
        .env
        .get("TENSOR_WASM_SHUTDOWN_GRACE_S")
        .map_or(30, |g| g.parse().expect("TENSOR_WASM_SHUTDOWN_GRACE_S"));
    let signal = signal_name(image.stop_signal.as_deref().expect("STOPSIGNAL"));
    let sent = Instant::now();
    let kill = Command::new("kill")
        .args(["-s", &signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success(), "kill -s {signal}");
    let status = wait_with_timeout(&mut child, Duration::from_secs(grace_s));
    let Some(status) = status else {
        let _ = child.kill();
        panic!(
            "no exit within {grace_s} s of SIG{signal}\nserver log:\n{}",
            log()
        );
    };
    assert!(
        status.success(),
        "exit after SIG{signal}: {status}\nserver log:\n{}",
        log()
    );
    eprintln!(
        "exited 0 {:?} after SIG{signal} (grace {grace_s} s)",
        sent.elapsed()
    );

    // And the health check really checks: it fails with the server gone.
    let after = run_healthcheck(&image, &subst, true);
    assert!(!after.success(), "HEALTHCHECK passes with no server");
}

#[test]
fn config_reference_in_docs_is_current() {
    let script = repo_root().join("scripts/gen_config_reference.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--check", "--bin", BIN])
        .output()
        .expect("python3 runs scripts/gen_config_reference.py");
    assert!(
        out.status.success(),
        "docs/deploy.md is stale; run `python3 scripts/gen_config_reference.py`\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
