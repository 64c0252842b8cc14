//! The `tensor-wasm` binary: run the server (`serve`), describe this host's kernel devices
//! and check a data directory (`doctor`), or talk to a server (`deploy`, `invoke`, `job`, `functions`, `delete`,
//! `snapshot`).
//!
//! Output goes to stdout through `writeln!`, never `println!`: a reader that goes away
//! (`tensor-wasm doctor | head -3`) ends the command quietly, with status 0, instead of a
//! panic on the closed pipe.

mod client;
mod import;
mod job_flags;
mod serve;
mod shared;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// TensorWasm: a serverless runtime for WebAssembly functions.
#[derive(Debug, Parser)]
#[command(name = "tensor-wasm", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP server.
    Serve(Box<serve::ServeArgs>),
    /// Apply the shared store's schema migrations (`serve --store` also applies them at
    /// start, under the same lock) and print which ran.
    Migrate {
        /// The shared store's PostgreSQL URL.
        #[arg(long, env = "TENSOR_WASM_STORE", hide_env_values = true)]
        store: String,
    },
    /// Copy a single-node data dir (tenants, tokens, functions, modules, snapshots) into the
    /// shared store, to grow from one process to replicas. Safe to run again; refuses a store
    /// that holds another installation's state.
    ImportDataDir {
        /// The data dir to copy (only read).
        #[arg(long)]
        data_dir: PathBuf,
        /// The shared store's PostgreSQL URL.
        #[arg(long, env = "TENSOR_WASM_STORE", hide_env_values = true)]
        store: String,
        /// The shared store's object storage, `s3://bucket/prefix` (endpoint and credentials
        /// from the `AWS_*` environment).
        #[arg(long, env = "TENSOR_WASM_BLOB_STORE")]
        blob_store: String,
    },
    /// Remove the shared store's orphaned blobs: modules no function names any more, snapshot
    /// images without a record and model bytes no model names, once older than the grace
    /// period. Run it from time to time (a cron job); safe beside running replicas.
    CollectOrphans {
        /// The shared store's PostgreSQL URL.
        #[arg(long, env = "TENSOR_WASM_STORE", hide_env_values = true)]
        store: String,
        /// The shared store's object storage, `s3://bucket/prefix`.
        #[arg(long, env = "TENSOR_WASM_BLOB_STORE")]
        blob_store: String,
        /// Seconds a blob must have gone unused before it is removed; longer than any deploy
        /// or capture takes.
        #[arg(long, default_value_t = 3600)]
        grace_s: u64,
        /// Only count what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show the kernel devices this host has (or why CUDA is unavailable) and
    /// which backend `serve --device auto` would use. With --data-dir, also list the
    /// function records in quarantine (exit status 1 when there are any).
    Doctor {
        /// A server's data directory to check (read only; the server may be running).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Deploy a module (.wasm binary or .wat text) and print the new function.
    Deploy {
        /// Path of the module.
        file: PathBuf,
        /// Function name (default: the file stem).
        #[arg(long)]
        name: Option<String>,
        /// Invocation style: `export` (call exports with JSON args) or `wasi` (stdin/stdout command).
        #[arg(long, default_value = "export", value_parser = ["export", "wasi"])]
        style: String,
        /// Per-invocation deadline in milliseconds (server default if unset).
        #[arg(long)]
        timeout_ms: Option<u64>,
        /// Per-invocation memory limit in bytes (server default if unset).
        #[arg(long)]
        memory_limit_bytes: Option<u64>,
        /// Fuel budget per invocation (the server must run with --fuel).
        #[arg(long)]
        fuel: Option<u64>,
        /// Ask for the raw-PTX capability (the server must run with --allow-raw-ptx).
        #[arg(long)]
        raw_ptx: bool,
        #[command(flatten)]
        server: client::ServerArg,
    },
    /// Invoke a function. With --export, call that export with --arg values;
    /// without, send stdin as the body of a WASI command and print its stdout.
    Invoke {
        /// Function id.
        id: String,
        /// Export to call (export-style functions).
        #[arg(long)]
        export: Option<String>,
        /// Argument, repeatable: a JSON number, or a string such as "NaN" or a 64-bit decimal.
        #[arg(long = "arg", allow_hyphen_values = true)]
        args: Vec<String>,
        /// Stream output to stdout as it is produced (stdin is the function's input):
        /// with --export the export's `tw:stream` chunks, without it a WASI command's
        /// stdout; the final event (results, or exit code and stderr tail) follows on
        /// stderr.
        #[arg(long, conflicts_with = "async")]
        stream: bool,
        /// Start the call as an asynchronous job and print its id (see `job`).
        #[arg(long = "async", requires = "export")]
        r#async: bool,
        #[command(flatten)]
        server: client::ServerArg,
    },
    /// Wait for an asynchronous job to finish and print it.
    Job {
        /// Job id (from `invoke --async`).
        id: String,
        /// Print the job once instead of waiting for it to finish.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        server: client::ServerArg,
    },
    /// List deployed functions.
    Functions {
        #[command(flatten)]
        server: client::ServerArg,
    },
    /// Delete a function.
    Delete {
        /// Function id.
        id: String,
        #[command(flatten)]
        server: client::ServerArg,
    },
    /// Capture, list and delete snapshots of a function's initialised state.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Run the init export in a fresh instance and capture it; by default every later
    /// instance starts from the new snapshot.
    Create {
        /// Function id.
        id: String,
        /// Export to run before the capture (no parameters).
        #[arg(long, default_value = "init")]
        init: String,
        /// Keep instances starting as they do now instead of from this snapshot.
        #[arg(long)]
        no_activate: bool,
        #[command(flatten)]
        server: client::ServerArg,
    },
    /// List a function's snapshots and the one its instances start from.
    List {
        /// Function id.
        id: String,
        #[command(flatten)]
        server: client::ServerArg,
    },
    /// Delete a snapshot (not the one the function starts from: `use` another first).
    Delete {
        /// Function id.
        id: String,
        /// Snapshot id.
        snapshot: String,
        #[command(flatten)]
        server: client::ServerArg,
    },
    /// Choose what instances start from: a snapshot id, `latest`, or `none`.
    Use {
        /// Function id.
        id: String,
        /// Snapshot id, `latest`, or `none` for fresh instances.
        snapshot: String,
        #[command(flatten)]
        server: client::ServerArg,
    },
}

fn doctor(data_dir: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let discovery = tensor_wasm_gpu::discover();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{discovery}")?;
    let backend = tensor_wasm_gpu::open_backend(tensor_wasm_gpu::DeviceChoice::Auto)?;
    writeln!(out, "serve --device auto would use: {}", backend.device())?;
    let Some(dir) = data_dir else {
        return Ok(ExitCode::SUCCESS);
    };
    let quarantined = tensor_wasm_runtime::inspect_quarantine(dir)
        .with_context(|| format!("checking the data directory {}", dir.display()))?;
    if quarantined.is_empty() {
        writeln!(
            out,
            "data directory {}: no quarantined records",
            dir.display()
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "data directory {}: {} function record(s) in quarantine (their modules and \
         snapshots are kept; repair a record and move it back to functions/, or remove it):",
        dir.display(),
        quarantined.len()
    )?;
    for record in &quarantined {
        writeln!(out, "  {}: {}", record.path.display(), record.reason)?;
    }
    Ok(ExitCode::FAILURE)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args).map(|()| ExitCode::SUCCESS),
        Command::Doctor { data_dir } => doctor(data_dir.as_deref()),
        Command::Migrate { store } => shared::migrate(&store).map(|()| ExitCode::SUCCESS),
        Command::CollectOrphans {
            store,
            blob_store,
            grace_s,
            dry_run,
        } => shared::collect_orphans(&store, &blob_store, grace_s, dry_run)
            .map(|()| ExitCode::SUCCESS),
        Command::ImportDataDir {
            data_dir,
            store,
            blob_store,
        } => import::import_data_dir(&data_dir, &store, &blob_store).map(|()| ExitCode::SUCCESS),
        Command::Deploy {
            file,
            name,
            style,
            timeout_ms,
            memory_limit_bytes,
            fuel,
            raw_ptx,
            server,
        } => client::deploy(
            &server,
            &file,
            client::DeployOptions {
                name,
                style,
                timeout_ms,
                memory_limit_bytes,
                fuel,
                raw_ptx,
            },
        ),
        Command::Invoke {
            id,
            export,
            args,
            stream: true,
            server,
            ..
        } => client::invoke_stream(&server, &id, export.as_deref(), &args),
        Command::Invoke {
            id,
            export,
            args,
            r#async: true,
            server,
            ..
        } => client::invoke_async(&server, &id, export.as_deref().unwrap_or_default(), &args),
        Command::Invoke {
            id,
            export,
            args,
            server,
            ..
        } => client::invoke(&server, &id, export.as_deref(), &args),
        Command::Job {
            id,
            no_wait,
            server,
        } => client::job(&server, &id, !no_wait),
        Command::Functions { server } => client::functions(&server),
        Command::Delete { id, server } => client::delete(&server, &id),
        Command::Snapshot(SnapshotCommand::Create {
            id,
            init,
            no_activate,
            server,
        }) => client::snapshot_create(&server, &id, &init, !no_activate),
        Command::Snapshot(SnapshotCommand::List { id, server }) => {
            client::snapshot_list(&server, &id)
        }
        Command::Snapshot(SnapshotCommand::Delete {
            id,
            snapshot,
            server,
        }) => client::snapshot_delete(&server, &id, &snapshot),
        Command::Snapshot(SnapshotCommand::Use {
            id,
            snapshot,
            server,
        }) => client::snapshot_use(&server, &id, &snapshot),
    };
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `e` comes from writing to a pipe whose reader has gone away.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
