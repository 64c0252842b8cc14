//! The real `tensor-wasm serve` binary on a loopback port, driven by a real
//! HTTP client (ureq) and by the CLI itself.
//!
//! The binary's path comes from the test (`env!("CARGO_BIN_EXE_tensor-wasm")`
//! is only defined in the CLI crate's own tests, which makes cargo build the
//! binary of the same profile first).

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::wait::wait_until;

/// How long a fresh server may take to answer `/readyz` with 200.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `tensor-wasm serve`, killed when dropped.
pub struct ServeProcess {
    pub child: Child,
    /// `http://127.0.0.1:<port>`, from the server's first line of stdout.
    pub base: String,
    pub data_dir: PathBuf,
    /// The default tenant's token, from the credentials file of the first start.
    pub token: String,
    bin: PathBuf,
}

impl ServeProcess {
    /// Starts `bin serve` on `127.0.0.1:0` over `data_dir` with `extra`
    /// arguments, logging warnings to the test's stderr, and waits until it
    /// is ready.
    pub fn start(bin: &Path, data_dir: &Path, extra: &[&str]) -> ServeProcess {
        Self::start_logging(bin, data_dir, extra, "warn", Stdio::inherit())
    }

    /// Like [`ServeProcess::start`] with log filter `log` written to `stderr`.
    pub fn start_logging(
        bin: &Path,
        data_dir: &Path,
        extra: &[&str],
        log: &str,
        stderr: Stdio,
    ) -> ServeProcess {
        Self::start_with_env(bin, data_dir, extra, &[], log, stderr)
    }

    /// Like [`ServeProcess::start_logging`] with the environment variables `env` set for the
    /// server (e.g. `LD_LIBRARY_PATH` for a stand-in driver).
    pub fn start_with_env(
        bin: &Path,
        data_dir: &Path,
        extra: &[&str],
        env: &[(&str, &OsStr)],
        log: &str,
        stderr: Stdio,
    ) -> ServeProcess {
        let mut child = Command::new(bin)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .envs(env.iter().copied())
            .env("RUST_LOG", log)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("starting tensor-wasm serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the server's first line");
        let base = line
            .trim()
            .strip_prefix("tensor-wasm listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        let credentials: Value = serde_json::from_str(
            &std::fs::read_to_string(data_dir.join("credentials.json"))
                .expect("the server writes credentials.json on first start"),
        )
        .expect("credentials JSON");
        let token = credentials["tenant_token"]
            .as_str()
            .expect("tenant_token")
            .to_owned();
        let server = ServeProcess {
            child,
            base,
            data_dir: data_dir.to_owned(),
            token,
            bin: bin.to_owned(),
        };
        wait_until(READY_TIMEOUT, "the server answers /readyz with 200", || {
            server.get("/readyz").0 == 200
        });
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A client with a 60 s timeout.
    pub fn agent() -> ureq::Agent {
        ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(60))
            .build()
    }

    /// The default tenant's `authorization` header value.
    pub fn auth(&self) -> String {
        format!("Bearer {}", self.token)
    }

    fn credentials(&self) -> Value {
        serde_json::from_str(
            &std::fs::read_to_string(self.data_dir.join("credentials.json"))
                .expect("credentials.json"),
        )
        .expect("credentials JSON")
    }

    /// The default tenant's id.
    pub fn tenant_id(&self) -> String {
        self.credentials()["tenant_id"]
            .as_str()
            .expect("tenant_id")
            .to_owned()
    }

    /// Creates tenant `name` with the admin token and returns its token.
    pub fn create_tenant(&self, name: &str) -> String {
        let (status, body, _) = Self::reply(
            Self::agent()
                .post(&self.url("/tenants"))
                .set("authorization", &self.admin_auth())
                .send_json(serde_json::json!({ "name": name })),
        );
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        json_of(&body)["token"]
            .as_str()
            .expect("the new tenant's token")
            .to_owned()
    }

    /// Deploys `wasm` (a module or WAT text) as the tenant with `token`; the function id.
    pub fn deploy_as(&self, token: &str, query: &str, wasm: &[u8]) -> String {
        let (status, body, _) = Self::reply(
            Self::agent()
                .post(&self.url(&format!("/functions?{query}")))
                .set("authorization", &format!("Bearer {token}"))
                .set("content-type", "application/wasm")
                .send_bytes(wasm),
        );
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        json_of(&body)["id"]
            .as_str()
            .expect("the function id")
            .to_owned()
    }

    /// The admin token's `authorization` header value.
    pub fn admin_auth(&self) -> String {
        format!(
            "Bearer {}",
            self.credentials()["admin_token"]
                .as_str()
                .expect("admin_token")
        )
    }

    /// Lets the default tenant run `n` invocations at once (admin PATCH).
    pub fn raise_quotas(&self, n: u64) {
        let tenant = self.tenant_id();
        let body = json!({"quotas": {
            "max_concurrent_invocations": n,
            "max_live_instances": n,
            "max_guest_memory_bytes": n << 30,
        }});
        let (status, reply, _) = Self::reply(
            Self::agent()
                .request("PATCH", &self.url(&format!("/tenants/{tenant}")))
                .set("authorization", &self.admin_auth())
                .send_json(body),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    }

    /// Invokes function `id` with `body` as `token`'s tenant on a thread of its own: the
    /// status, the JSON answer and how long it took.
    pub fn invoke_in_background(
        &self,
        token: &str,
        id: &str,
        body: Value,
    ) -> std::thread::JoinHandle<(u16, Value, Duration)> {
        let url = self.url(&format!("/functions/{id}/invoke"));
        let auth = format!("Bearer {token}");
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            let (status, reply, _) = Self::reply(
                Self::agent()
                    .post(&url)
                    .set("authorization", &auth)
                    .send_json(body),
            );
            (status, json_of(&reply), start.elapsed())
        })
    }

    /// Status, body and `x-exit-code` of an answer; panics on a transport error.
    pub fn reply(result: Result<ureq::Response, ureq::Error>) -> (u16, Vec<u8>, Option<String>) {
        let response = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("transport error: {e}"),
        };
        let status = response.status();
        let exit = response.header("x-exit-code").map(str::to_owned);
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut response.into_reader(), &mut body).expect("body");
        (status, body, exit)
    }

    /// GET as the default tenant (`/metrics` as the admin).
    pub fn get(&self, path: &str) -> (u16, Vec<u8>) {
        let auth = if path == "/metrics" {
            self.admin_auth()
        } else {
            self.auth()
        };
        let (s, b, _) = Self::reply(
            Self::agent()
                .get(&self.url(path))
                .set("authorization", &auth)
                .call(),
        );
        (s, b)
    }

    /// POST as the default tenant.
    pub fn post(&self, path: &str, ctype: &str, body: &[u8]) -> (u16, Vec<u8>, Option<String>) {
        Self::reply(
            Self::agent()
                .post(&self.url(path))
                .set("content-type", ctype)
                .set("authorization", &self.auth())
                .send_bytes(body),
        )
    }

    /// Posts an oversize body. The server answers 413 and closes as soon as
    /// the limit is passed, so a client still writing may see a broken pipe
    /// instead of the answer: that transport race is retried, never the status.
    pub fn oversize_post(&self, path: &str, len: usize) -> (u16, Vec<u8>) {
        let body = vec![0u8; len];
        for _ in 0..10 {
            let result = Self::agent()
                .post(&self.url(path))
                .set("content-type", "application/wasm")
                .set("authorization", &self.auth())
                .send_bytes(&body);
            match result {
                Err(ureq::Error::Transport(_)) => continue,
                other => {
                    let (status, body, _) = Self::reply(other);
                    return (status, body);
                }
            }
        }
        panic!("no answer to the oversize request in 10 tries");
    }

    /// Deploys the module at `file` with the query `query`; returns its id.
    pub fn deploy(&self, file: &Path, query: &str) -> String {
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let (status, body, _) =
            self.post(&format!("/functions?{query}"), "application/wasm", &bytes);
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        json_of(&body)["id"].as_str().expect("an id").to_owned()
    }

    /// Calls `export` of function `id` with `args`: status and JSON answer.
    pub fn call(&self, id: &str, export: &str, args: Value) -> (u16, Value) {
        let body = json!({"export": export, "args": args}).to_string();
        let (status, body, _) = self.post(
            &format!("/functions/{id}/invoke"),
            "application/json",
            body.as_bytes(),
        );
        (status, json_of(&body))
    }

    /// The value of the metric series `series` (name and labels), if present.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let text = String::from_utf8(self.get("/metrics").1).expect("UTF-8 metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    /// The sum of the series of metric `name` whose labels include `label`
    /// (such as `tenant="tn-…"`); 0 when there are none.
    pub fn metric_sum(&self, name: &str, label: &str) -> f64 {
        let text = String::from_utf8(self.get("/metrics").1).expect("UTF-8 metrics");
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                series.contains(label).then(|| value.parse::<f64>().ok())?
            })
            .sum()
    }

    /// Runs the CLI against this server with `stdin` as its input.
    pub fn cli(&self, args: &[&str], stdin: &[u8]) -> std::process::Output {
        let mut child = Command::new(&self.bin)
            .args(args)
            .env("TENSOR_WASM_SERVER", &self.base)
            .env(
                "TENSOR_WASM_CREDENTIALS",
                self.data_dir.join("credentials.json"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the CLI");
        std::io::Write::write_all(&mut child.stdin.take().expect("piped stdin"), stdin)
            .expect("writing the CLI's stdin");
        child.wait_with_output().expect("the CLI's output")
    }

    /// Sends SIGTERM to the server.
    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM failed: {status:?}");
    }

    /// SIGTERM, then asserts a clean exit.
    pub fn terminate(mut self) {
        self.sigterm();
        let status = self.child.wait().expect("waiting for the server");
        assert!(status.success(), "graceful shutdown failed: {status:?}");
    }

    /// SIGKILL, and reaps the process.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("waiting for the server");
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `body` as JSON; panics with the body when it is not.
pub fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

/// The `error.code` of an error body, `<none>` without one.
pub fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<none>")
}

/// The hostile waits the examples' HTTP handlers share (`http_app.py`, `http.c`): `/clog`
/// (writes to a response body nobody reads), `/flush` (`blocking-flush` on it), `/splice` (a
/// request body spliced into it) and `/pollwrite` (`poll` on its never-ready pollable), 50 in
/// a row on handler `id`, deployed with a short deadline. Each waits in the host, where the
/// epoch deadline cannot stop it, and must answer 504 `invocation_timeout` all the same. Then
/// the handler's `/hello` answers 200, the server's instance slots and every tenant's guest
/// memory gauge are back at 0, and each of the 50 was counted as dropped at its deadline.
pub fn hostile_waits_in_a_row(server: &ServeProcess, id: &str) {
    let at = |path: &str| format!("/functions/{id}/http{path}");
    let cancelled = || {
        server
            .metric("tensor_wasm_component_deadline_cancellations_total{style=\"http\"}")
            .unwrap_or(0.0)
    };
    let before = cancelled();
    let body = vec![b'y'; 256 << 10];
    for (i, path) in ["/clog", "/flush", "/splice", "/pollwrite"]
        .iter()
        .cycle()
        .take(50)
        .enumerate()
    {
        let (status, answer) = if *path == "/splice" {
            let (status, answer, _) = server.post(&at(path), "application/octet-stream", &body);
            (status, answer)
        } else {
            server.get(&at(path))
        };
        assert_eq!(
            (status, error_code(&json_of(&answer))),
            (504, "invocation_timeout"),
            "{i}: {path}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    assert_eq!(server.get(&at("/hello")).0, 200, "still serving");
    // Every series of each gauge (one per tenant for the guest memory) at 0.
    let idle = || {
        let text = String::from_utf8(server.get("/metrics").1).expect("UTF-8 metrics");
        let values: Vec<f64> = text
            .lines()
            .filter(|l| {
                l.starts_with("tensor_wasm_instance_slots_in_use")
                    || l.starts_with("tensor_wasm_tenant_guest_memory_bytes")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        values.len() >= 2 && values.iter().all(|v| *v == 0.0)
    };
    wait_until(
        Duration::from_secs(10),
        "instance slots and guest memory back to idle",
        idle,
    );
    let counted = cancelled() - before;
    assert!(counted >= 50.0, "{counted} deadline cancellations counted");
}

/// Replicas of `tensor-wasm serve` over one shared store: each in a data dir of its own, with
/// the same flags (the store's among them) and environment (the S3 client's). The first
/// replica bootstraps the shared tenants; every other one is given its credentials file
/// before it starts, as an operator hands out the bootstrap secrets.
pub struct Replicas {
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(&'static str, std::ffi::OsString)>,
    log: &'static str,
    /// The data dirs of replicas `0..n`.
    pub dirs: Vec<tempfile::TempDir>,
}

impl Replicas {
    /// `n` data dirs for `bin serve` with `args`, `env` and log filter `log`.
    pub fn new(
        bin: &Path,
        n: usize,
        args: &[&str],
        env: Vec<(&'static str, std::ffi::OsString)>,
        log: &'static str,
    ) -> Self {
        Replicas {
            bin: bin.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env,
            log,
            dirs: (0..n)
                .map(|_| tempfile::tempdir().expect("a data dir"))
                .collect(),
        }
    }

    /// Starts replica `i` (replica 0 first: the others copy its credentials).
    pub fn start(&self, i: usize) -> ServeProcess {
        self.start_in(self.dirs[i].path(), &[])
    }

    /// Starts one more replica in `dir`, with `extra` flags after the common ones.
    pub fn start_in(&self, dir: &Path, extra: &[&str]) -> ServeProcess {
        let first = self.dirs[0].path();
        if dir != first && !dir.join("credentials.json").exists() {
            std::fs::copy(first.join("credentials.json"), dir.join("credentials.json"))
                .expect("copying the first replica's credentials");
        }
        let args: Vec<&str> = self
            .args
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .collect();
        let env: Vec<(&str, &OsStr)> = self.env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
        ServeProcess::start_with_env(&self.bin, dir, &args, &env, self.log, Stdio::inherit())
    }
}
