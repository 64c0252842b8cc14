//! The client subcommands: deploy, invoke, functions, delete over HTTP.

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Args;
use serde_json::{json, Value};

/// Where the server is, and the credentials to use.
#[derive(Debug, Args)]
pub struct ServerArg {
    /// Base URL of the server.
    #[arg(
        long,
        env = "TENSOR_WASM_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    server: String,
    /// Bearer token (a tenant token). Default: `tenant_token` of the credentials file.
    #[arg(long, env = "TENSOR_WASM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Credentials file the server writes on first start (used when no token is given).
    #[arg(
        long,
        env = "TENSOR_WASM_CREDENTIALS",
        default_value = "./tensor-wasm-data/credentials.json"
    )]
    credentials: std::path::PathBuf,
}

impl ServerArg {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.trim_end_matches('/'))
    }

    /// The token to send: `--token`, else the credentials file's tenant token.
    fn token(&self) -> Option<String> {
        if let Some(token) = &self.token {
            return Some(token.clone());
        }
        let text = std::fs::read_to_string(&self.credentials).ok()?;
        let value: Value = serde_json::from_str(&text).ok()?;
        value["tenant_token"].as_str().map(str::to_owned)
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let request = ureq::request(method, &self.url(path));
        match self.token() {
            Some(token) => request.set("authorization", &format!("Bearer {token}")),
            None => request,
        }
    }
}

/// Options of `deploy`.
#[derive(Debug)]
pub struct DeployOptions {
    pub name: Option<String>,
    pub style: String,
    pub timeout_ms: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    pub fuel: Option<u64>,
    pub raw_ptx: bool,
}

/// Sends a request and returns the response, turning API errors into errors
/// that carry the server's code and message.
fn send(request: ureq::Request, body: Option<&[u8]>) -> anyhow::Result<ureq::Response> {
    let result = match body {
        Some(bytes) => request.send_bytes(bytes),
        None => request.call(),
    };
    match result {
        Ok(response) => Ok(response),
        Err(ureq::Error::Status(status, response)) => {
            let text = response.into_string().unwrap_or_default();
            let detail = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| {
                    let e = v.get("error")?;
                    Some(format!(
                        "{} ({})",
                        e.get("message")?.as_str()?,
                        e.get("code")?.as_str()?
                    ))
                })
                .unwrap_or(text);
            bail!("server answered {status}: {detail}")
        }
        Err(e) => Err(anyhow::Error::new(e).context("request failed (is the server running?)")),
    }
}

fn print_json(response: ureq::Response) -> anyhow::Result<ExitCode> {
    let value: Value = response.into_json().context("reading the response")?;
    writeln!(
        std::io::stdout(),
        "{}",
        serde_json::to_string_pretty(&value)?
    )?;
    Ok(ExitCode::SUCCESS)
}

pub fn deploy(server: &ServerArg, file: &Path, options: DeployOptions) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let name = options.name.unwrap_or_else(|| {
        file.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "function".into())
    });
    let mut request = server
        .request("POST", "/functions")
        .set("content-type", "application/wasm")
        .query("name", &name)
        .query("style", &options.style);
    for (key, value) in [
        ("timeout_ms", options.timeout_ms),
        ("memory_limit_bytes", options.memory_limit_bytes),
        ("fuel", options.fuel),
    ] {
        if let Some(v) = value {
            request = request.query(key, &v.to_string());
        }
    }
    if options.raw_ptx {
        request = request.query("raw_ptx", "true");
    }
    print_json(send(request, Some(&bytes))?)
}

/// An `--arg` value: JSON when it parses (numbers), a string otherwise.
fn parse_arg(arg: &str) -> Value {
    serde_json::from_str(arg).unwrap_or_else(|_| Value::String(arg.to_owned()))
}

pub fn invoke(
    server: &ServerArg,
    id: &str,
    export: Option<&str>,
    args: &[String],
) -> anyhow::Result<ExitCode> {
    let path = format!("/functions/{id}/invoke");
    if let Some(export) = export {
        let body = json!({
            "export": export,
            "args": args.iter().map(|a| parse_arg(a)).collect::<Vec<_>>(),
        });
        let request = server
            .request("POST", &path)
            .set("content-type", "application/json");
        return print_json(send(request, Some(body.to_string().as_bytes()))?);
    }
    if !args.is_empty() {
        bail!("--arg needs --export (WASI commands read stdin)");
    }
    let mut stdin = Vec::new();
    std::io::stdin()
        .read_to_end(&mut stdin)
        .context("reading stdin")?;
    let request = server
        .request("POST", &path)
        .set("content-type", "application/octet-stream");
    let response = send(request, Some(&stdin))?;
    let exit_code = response
        .header("x-exit-code")
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(0);
    if let Some(tail) = response.header("x-stderr-tail") {
        if !tail.is_empty() {
            eprintln!("{tail}");
        }
    }
    let mut stdout = Vec::new();
    response
        .into_reader()
        .read_to_end(&mut stdout)
        .context("reading the response")?;
    std::io::stdout().write_all(&stdout)?;
    Ok(ExitCode::from(exit_code.clamp(0, 255) as u8))
}

/// `invoke --stream`: SSE from `/invoke-stream`; chunk data (text) goes to
/// stdout as each event arrives, the final results or error to stderr.
/// `invoke --stream`: chunks to stdout as they arrive; the final event to stderr. With an
/// export, an export call; without, a WASI command whose stdout streams (exit status =
/// the guest's).
pub fn invoke_stream(
    server: &ServerArg,
    id: &str,
    export: Option<&str>,
    args: &[String],
) -> anyhow::Result<ExitCode> {
    use std::io::BufRead;
    let args = Value::Array(args.iter().map(|a| parse_arg(a)).collect());
    let mut input = Vec::new();
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        std::io::stdin()
            .read_to_end(&mut input)
            .context("reading stdin")?;
    }
    let mut request = server.request("POST", &format!("/functions/{id}/invoke-stream"));
    if let Some(export) = export {
        request = request
            .query("export", export)
            .query("args", &args.to_string());
    }
    let request = request
        .query("encoding", "text")
        .set("accept", "text/event-stream")
        .set("content-type", "application/octet-stream");
    let response = send(request, Some(&input))?;
    let mut event = String::new();
    let mut data: Vec<String> = Vec::new();
    let mut stdout = std::io::stdout();
    let mut failed = false;
    let mut exit_code = 0u8;
    for line in std::io::BufReader::new(response.into_reader()).lines() {
        let line = line.context("reading the stream")?;
        if line.is_empty() {
            let payload = data.join("\n");
            match event.as_str() {
                "chunk" => {
                    stdout.write_all(payload.as_bytes())?;
                    stdout.flush()?;
                }
                "end" => {
                    eprintln!("{payload}");
                    let end: Value = serde_json::from_str(&payload).unwrap_or(Value::Null);
                    if let Some(code) = end.get("exit_code").and_then(Value::as_i64) {
                        exit_code = u8::try_from(code).unwrap_or(1);
                    }
                }
                "error" => {
                    eprintln!("error: {payload}");
                    failed = true;
                }
                _ => {}
            }
            event.clear();
            data.clear();
        } else if let Some(v) = line.strip_prefix("event:") {
            event = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::from(exit_code)
    })
}

/// `invoke --async`: starts a job and prints `{job_id, status}`.
pub fn invoke_async(
    server: &ServerArg,
    id: &str,
    export: &str,
    args: &[String],
) -> anyhow::Result<ExitCode> {
    let body = json!({
        "export": export,
        "args": args.iter().map(|a| parse_arg(a)).collect::<Vec<_>>(),
    });
    let request = server
        .request("POST", &format!("/functions/{id}/invoke-async"))
        .set("content-type", "application/json");
    print_json(send(request, Some(body.to_string().as_bytes()))?)
}

/// `job ID`: polls until the job is no longer queued or running, prints it,
/// and exits non-zero unless it succeeded.
pub fn job(server: &ServerArg, id: &str, wait: bool) -> anyhow::Result<ExitCode> {
    let mut delay = std::time::Duration::from_millis(50);
    loop {
        let job: Value = send(server.request("GET", &format!("/jobs/{id}")), None)?
            .into_json()
            .context("reading the job")?;
        let status = job["status"].as_str().unwrap_or_default().to_owned();
        if !wait || !matches!(status.as_str(), "queued" | "running") {
            writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&job)?)?;
            return Ok(if status == "succeeded" || !wait {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(std::time::Duration::from_secs(2));
    }
}

pub fn functions(server: &ServerArg) -> anyhow::Result<ExitCode> {
    print_json(send(server.request("GET", "/functions"), None)?)
}

pub fn delete(server: &ServerArg, id: &str) -> anyhow::Result<ExitCode> {
    send(server.request("DELETE", &format!("/functions/{id}")), None)?;
    writeln!(std::io::stdout(), "deleted {id}")?;
    Ok(ExitCode::SUCCESS)
}

pub fn snapshot_create(
    server: &ServerArg,
    id: &str,
    init_export: &str,
    activate: bool,
) -> anyhow::Result<ExitCode> {
    let body = serde_json::json!({ "init_export": init_export, "activate": activate });
    let request = server
        .request("POST", &format!("/functions/{id}/snapshots"))
        .set("content-type", "application/json");
    print_json(send(request, Some(body.to_string().as_bytes()))?)
}

pub fn snapshot_list(server: &ServerArg, id: &str) -> anyhow::Result<ExitCode> {
    print_json(send(
        server.request("GET", &format!("/functions/{id}/snapshots")),
        None,
    )?)
}

pub fn snapshot_delete(server: &ServerArg, id: &str, snapshot: &str) -> anyhow::Result<ExitCode> {
    send(
        server.request("DELETE", &format!("/functions/{id}/snapshots/{snapshot}")),
        None,
    )?;
    writeln!(std::io::stdout(), "deleted {snapshot}")?;
    Ok(ExitCode::SUCCESS)
}

pub fn snapshot_use(server: &ServerArg, id: &str, snapshot: &str) -> anyhow::Result<ExitCode> {
    let target = match snapshot {
        "none" => Value::Null,
        other => Value::String(other.to_owned()),
    };
    let body = serde_json::json!({ "start_from_snapshot": target });
    let request = server
        .request("PATCH", &format!("/functions/{id}"))
        .set("content-type", "application/json");
    print_json(send(request, Some(body.to_string().as_bytes()))?)
}
