//! `http-check`: the full path. The real `tensor-wasm serve` binary (`--device <device>
//! --guest-memory unified`) on a loopback port, driven over HTTP: every example module
//! under `examples/` with fixed inputs, and the launcher guest with every blueprint and
//! builtin plan (compared with the CPU backend in this process), plus hostile launches
//! (refused, and the server's `/metrics` shows no kernel admitted).
//!
//! Every response is recorded in a normalised form (`results.record`: ids, timestamps and
//! error messages left out) so that a run on another device can be compared with it:
//! `--expected FILE` (an earlier http-check file, normally `--device cpu`) fails each case
//! whose normalised response differs.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use tensor_wasm_gpu::{open_backend, DeviceChoice};

use crate::common::{Section, Suite};
use crate::correctness::memory_limit;
use crate::plan::{self, Plan, LAUNCHER_WAT};

/// The server under test; killed on drop.
pub(crate) struct Server {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    pub(crate) fn start(binary: &Path, data_dir: &Path, device: &str) -> anyhow::Result<Server> {
        let log = data_dir.join("server.log");
        // The server stays in this process's process group, so it does not live on with the
        // GPU when this process is stopped: the runner's `timeout` (scripts/gpu-suite/run.sh)
        // signals the whole group when a section runs past its limit (SIGTERM, then SIGKILL
        // 10 s later), as a terminal's Ctrl-C does; any other exit drops `Server`, which kills it.
        let mut child = Command::new(binary)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir.join("data"))
            .args(["--device", device, "--guest-memory", "unified"])
            .args(["--insecure-no-auth", "--default-timeout-ms", "120000"])
            .args([
                "--max-output-bytes",
                &crate::common::MAX_OUTPUT_BYTES.to_string(),
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {} serve", binary.display()))?;
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let base = line
            .trim()
            .strip_prefix("tensor-wasm listening on ")
            .map(str::to_owned);
        let mut server = Server {
            child,
            base: String::new(),
            log,
        };
        server.base = base.ok_or_else(|| {
            anyhow!(
                "the server did not start (first line {line:?}); log: {}",
                server.log_tail()
            )
        })?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = agent().get(&server.url("/readyz")).call() {
                if r.status() == 200 {
                    break;
                }
            }
            if Instant::now() > deadline {
                bail!("the server never became ready; log: {}", server.log_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(4096);
        text[text.floor_char_boundary(start)..].to_owned()
    }

    /// Sends a request; returns status, body and the `x-exit-code` header.
    pub(crate) fn send(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        content_type: &str,
        body: &[u8],
    ) -> anyhow::Result<Reply> {
        let mut request = agent().request(method, &self.url(path));
        for (k, v) in query {
            request = request.query(k, v);
        }
        let result = if method == "GET" {
            request.call()
        } else {
            request.set("content-type", content_type).send_bytes(body)
        };
        let response = match result {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => bail!("{method} {path}: {e}"),
        };
        let status = response.status();
        let exit_code = response.header("x-exit-code").and_then(|v| v.parse().ok());
        let mut bytes = Vec::new();
        response.into_reader().read_to_end(&mut bytes)?;
        Ok(Reply {
            status,
            exit_code,
            body: bytes,
        })
    }

    pub(crate) fn deploy(&self, module: &[u8], options: &[(&str, &str)]) -> anyhow::Result<String> {
        let reply = self.send("POST", "/functions", options, "application/wasm", module)?;
        let doc: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
        match doc["id"].as_str() {
            Some(id) if reply.status == 201 || reply.status == 200 => Ok(id.to_owned()),
            _ => bail!(
                "deploy {options:?} failed: {} {}",
                reply.status,
                String::from_utf8_lossy(&reply.body)
            ),
        }
    }

    fn call(&self, id: &str, export: &str, args: Value) -> anyhow::Result<Value> {
        let body = json!({"export": export, "args": args}).to_string();
        let reply = self.send(
            "POST",
            &format!("/functions/{id}/invoke"),
            &[],
            "application/json",
            body.as_bytes(),
        )?;
        Ok(normalise_json(&reply))
    }

    fn command(&self, id: &str, stdin: &[u8], mask_times: bool) -> anyhow::Result<Value> {
        let reply = self.send(
            "POST",
            &format!("/functions/{id}/invoke"),
            &[],
            "application/octet-stream",
            stdin,
        )?;
        let stdout = match String::from_utf8(reply.body.clone()) {
            Ok(text) if mask_times => json!(mask_unix_ns(&text)),
            Ok(text) if text.len() <= 4096 => json!(text),
            _ => json!({"sha256": sha256(&reply.body), "bytes": reply.body.len()}),
        };
        Ok(json!({"http": reply.status, "exit_code": reply.exit_code, "stdout": stdout}))
    }

    /// Kernels the server's dispatcher has completed (`/metrics`).
    fn kernels_completed(&self) -> anyhow::Result<u64> {
        let reply = self.send("GET", "/metrics", &[], "", &[])?;
        let text = String::from_utf8_lossy(&reply.body);
        text.lines()
            .find_map(|l| l.strip_prefix("tensor_wasm_dispatch_latency_seconds_count "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
            .ok_or_else(|| anyhow!("no tensor_wasm_dispatch_latency_seconds_count in /metrics"))
    }
}

pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) exit_code: Option<i32>,
    pub(crate) body: Vec<u8>,
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(300))
        .build()
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An export call's reply without what may differ between runs: results as they are, an
/// error by its code only.
fn normalise_json(reply: &Reply) -> Value {
    let doc: Value = serde_json::from_slice(&reply.body)
        .unwrap_or_else(|_| json!({"unparsed_sha256": sha256(&reply.body)}));
    match doc.get("error") {
        Some(error) => json!({"http": reply.status, "error_code": error["code"]}),
        None => json!({"http": reply.status, "body": doc}),
    }
}

/// `text` with the digits after every `unix_ns=` replaced by `<t>`.
fn mask_unix_ns(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("unix_ns=") {
        out.push_str(&rest[..at + 8]);
        rest = rest[at + 8..].trim_start_matches(|c: char| c.is_ascii_digit());
        out.push_str("<t>");
    }
    out.push_str(rest);
    out
}

pub fn run(
    suite: &Suite,
    server_binary: &Path,
    examples: &Path,
    expected: &[PathBuf],
) -> anyhow::Result<Section> {
    let device = if suite.is_cuda() { "cuda" } else { "cpu" };
    let dir = suite.scratch()?;
    let server = Server::start(server_binary, dir.path(), device)?;
    let mut section = Section::default();
    let mut record = Map::new();
    let result = exercise(suite, &server, examples, &mut record, &mut section);
    section.set("server_log_tail", json!(server.log_tail()));
    result?;

    // Launcher plans against the CPU backend are checked in `plans`; here every recorded
    // case is compared with each expected record.
    for path in expected {
        let doc: Value = serde_json::from_str(
            &std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?,
        )?;
        let theirs = doc["results"]["record"]
            .as_object()
            .ok_or_else(|| anyhow!("{} has no results.record", path.display()))?;
        let mut differing = Vec::new();
        let mut compared = 0;
        for (name, value) in theirs {
            if let Some(ours) = record.get(name) {
                compared += 1;
                if ours != value {
                    differing.push(name.clone());
                }
            }
        }
        let missing: Vec<&String> = theirs.keys().filter(|k| !record.contains_key(*k)).collect();
        section.check(
            format!(
                "every response equals the {} record in {}",
                doc["backend"].as_str().unwrap_or("?"),
                path.display()
            ),
            differing.is_empty() && compared > 0,
            format!(
                "{compared} cases compared, {} differ{}{}",
                differing.len(),
                if differing.is_empty() {
                    String::new()
                } else {
                    format!(": {}", differing.join(", "))
                },
                if missing.is_empty() {
                    String::new()
                } else {
                    format!("; {} cases of the record not run here", missing.len())
                }
            ),
        );
    }
    section.set("record", Value::Object(record));
    section.set("server", json!({
        "binary": server_binary.display().to_string(),
        "flags": format!("serve --device {device} --guest-memory unified --insecure-no-auth --default-timeout-ms 120000"),
    }));
    Ok(section)
}

fn exercise(
    suite: &Suite,
    server: &Server,
    examples: &Path,
    record: &mut Map<String, Value>,
    section: &mut Section,
) -> anyhow::Result<()> {
    let read = |name: &str| -> anyhow::Result<Vec<u8>> {
        let path = examples.join(name);
        std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
    };
    let mut put = |name: &str, value: Value| {
        record.insert(name.to_owned(), value);
    };

    // calc.wat: plain export calls.
    let calc = server.deploy(&read("calc.wat")?, &[("name", "calc")])?;
    for (export, args) in [
        ("add", json!([1, 2])),
        ("mul64", json!([4_000_000_000i64, 3])),
        ("hypot", json!([3.0, 4.0])),
        ("div", json!([7, 2])),
        ("div", json!([1, 0])),
        ("bump", json!([])),
    ] {
        put(
            &format!("calc.{export}{args}"),
            server.call(&calc, export, args)?,
        );
    }

    // vector_add.wat: the builtin kernel from a guest, and its hostile export.
    let vadd = server.deploy(&read("vector_add.wat")?, &[("name", "vector_add")])?;
    for n in [1, 1000, 65536, 0] {
        put(
            &format!("vector_add.run[{n}]"),
            server.call(&vadd, "run", json!([n]))?,
        );
    }
    let before = server.kernels_completed()?;
    let hostile = server.call(&vadd, "out_of_bounds", json!([]))?;
    let after = server.kernels_completed()?;
    section.check(
        "HTTP hostile: vector_add.wat out_of_bounds() refused before launch",
        hostile["body"]["results"] == json!([-1]) && after == before,
        format!(
            "reply {hostile}; kernels completed by the server during the call: {}",
            after - before
        ),
    );
    put("vector_add.out_of_bounds", hostile);

    // upper.wat: a WASI command.
    let upper = server.deploy(&read("upper.wat")?, &[("name", "upper"), ("style", "wasi")])?;
    put(
        "upper",
        server.command(&upper, b"Hello, GPU suite!\n", false)?,
    );

    // warm.wat: snapshot, then instances that start from it.
    let warm = server.deploy(&read("warm.wat")?, &[("name", "warm")])?;
    let snap = server.send(
        "POST",
        &format!("/functions/{warm}/snapshots"),
        &[],
        "application/json",
        b"{}",
    )?;
    put("warm.snapshot", json!({"http": snap.status}));
    for (export, args) in [
        ("lookup", json!([5])),
        ("lookup", json!([100_000])),
        ("tag", json!([])),
        ("weight", json!([])),
        ("init_runs", json!([])),
        ("bump", json!([])),
    ] {
        put(
            &format!("warm.{export}{args}"),
            server.call(&warm, export, args)?,
        );
    }

    // hog.wat and loop.wat: limits.
    let hog = server.deploy(
        &read("hog.wat")?,
        &[("name", "hog"), ("memory_limit_bytes", "4194304")],
    )?;
    put("hog.grow", server.call(&hog, "grow", json!([]))?);
    let spin = server.deploy(
        &read("loop.wat")?,
        &[("name", "loop"), ("timeout_ms", "300")],
    )?;
    put("loop.spin", server.call(&spin, "spin", json!([]))?);

    // sleep.wat and stream.wat.
    let sleep = server.deploy(&read("sleep.wat")?, &[("name", "sleep")])?;
    put("sleep.nap[20]", server.call(&sleep, "nap", json!([20]))?);
    let stream = server.deploy(&read("stream.wat")?, &[("name", "stream")])?;
    let reply = server.send(
        "POST",
        &format!("/functions/{stream}/invoke-stream"),
        &[("export", "ticks"), ("args", "[3,0]")],
        "application/octet-stream",
        b"input chunk",
    )?;
    put(
        "stream.ticks[3,0]",
        json!({"http": reply.status, "body": String::from_utf8_lossy(&reply.body)}),
    );

    // The C examples (WASI commands).
    let c_opts = |name: &'static str| {
        [
            ("name", name),
            ("style", "wasi"),
            ("memory_limit_bytes", "67108864"),
        ]
    };
    let wordcount = server.deploy(&read("c/wordcount.wasm")?, &c_opts("wordcount"))?;
    put(
        "c/wordcount",
        server.command(
            &wordcount,
            b"the quick brown fox\njumps over\nthe lazy dog\n",
            false,
        )?,
    );
    let matmul = server.deploy(&read("c/matmul.wasm")?, &c_opts("matmul"))?;
    for input in ["64 64 64", "129 65 33", "256 256 256"] {
        put(
            &format!("c/matmul[{input}]"),
            server.command(&matmul, input.as_bytes(), false)?,
        );
    }
    let blueprints = server.deploy(&read("c/blueprints.wasm")?, &c_opts("blueprints"))?;
    for input in ["100", "37", "250"] {
        put(
            &format!("c/blueprints[{input}]"),
            server.command(&blueprints, input.as_bytes(), false)?,
        );
    }
    let ticker = server.deploy(&read("c/ticker.wasm")?, &c_opts("ticker"))?;
    put("c/ticker[2 0 3]", server.command(&ticker, b"2 0 3", true)?);
    for (name, value) in record.iter() {
        if name.starts_with("c/matmul") || name.starts_with("c/blueprints") {
            let ok = value["exit_code"] == json!(0);
            section.check(
                format!("{name}: the guest's own check passed (exit code 0)"),
                ok,
                value["stdout"].to_string(),
            );
        }
    }

    // The launcher: every blueprint and builtin, against the CPU backend.
    let shapes = if suite.quick { 1 } else { 2 };
    let plans = plan::catalogue(shapes)?;
    let limit = memory_limit(&plans).to_string();
    let launcher = server.deploy(
        LAUNCHER_WAT.as_bytes(),
        &[
            ("name", "launcher"),
            ("style", "wasi"),
            ("memory_limit_bytes", &limit),
        ],
    )?;
    let cpu = open_backend(DeviceChoice::Cpu)?;
    let mut differing = Vec::new();
    for p in &plans {
        let expected = p.reference(&*cpu)?;
        let (run, http) = run_plan(server, &launcher, p)?;
        let (mismatches, first) = if run.status == 0 {
            plan::compare(p.out_type, &run.out, &expected)
        } else {
            (expected.len() / 4, None)
        };
        if run.status != 0 || mismatches > 0 {
            differing.push(format!(
                "{} (status {}, {mismatches} differ, first {first:?})",
                p.name, run.status
            ));
        }
        record.insert(
            format!("launcher:{}", p.name),
            json!({"http": http, "status": run.status, "digest": plan::digest(p.out_type, &run.out)}),
        );
    }
    section.check(
        "HTTP: every blueprint and builtin equals the CPU backend",
        differing.is_empty(),
        format!(
            "{} of {} plans equal{}",
            plans.len() - differing.len(),
            plans.len(),
            if differing.is_empty() {
                String::new()
            } else {
                format!("; {}", differing.join("; "))
            }
        ),
    );
    for p in plan::hostile_plans() {
        let before = server.kernels_completed()?;
        let (run, http) = run_plan(server, &launcher, &p)?;
        let after = server.kernels_completed()?;
        section.check(
            format!("HTTP {}", p.name),
            run.status == -1 && after == before,
            format!(
                "status {} ({}), kernels completed during the call: {}",
                run.status,
                run.message,
                after - before
            ),
        );
        record.insert(
            format!("launcher:{}", p.name),
            json!({"http": http, "status": run.status}),
        );
    }
    section.set("plans", json!(plans.len()));
    Ok(())
}

fn run_plan(server: &Server, id: &str, p: &Plan) -> anyhow::Result<(plan::GuestRun, u16)> {
    let reply = server.send(
        "POST",
        &format!("/functions/{id}/invoke"),
        &[],
        "application/octet-stream",
        &p.encode()?,
    )?;
    if reply.status != 200 || reply.exit_code != Some(0) {
        bail!(
            "launcher for {}: HTTP {} exit {:?}: {}",
            p.name,
            reply.status,
            reply.exit_code,
            String::from_utf8_lossy(&reply.body)
        );
    }
    Ok((plan::parse_output(&reply.body)?, reply.status))
}
