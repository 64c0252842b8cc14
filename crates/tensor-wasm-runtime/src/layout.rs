//! What a data directory holds, path by path, and which paths a backup must hold: the one
//! list that docs/deploy.md's backup table and commands are checked against, and that the
//! backup-and-restore test copies.

/// Whether a path of the data directory belongs in a backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backup {
    /// Yes: it is state that nothing rebuilds.
    Yes,
    /// Yes, and it holds secrets.
    Secret,
    /// No: a cache or scratch space, rebuilt or emptied on demand.
    No,
}

/// One path of a data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataDirEntry {
    /// Relative to the data directory; a directory ends with `/`.
    pub path: &'static str,
    /// What it holds.
    pub what: &'static str,
    /// Whether a backup holds it.
    pub backup: Backup,
}

/// Every path a server writes under its data directory (`serve --data-dir`).
pub const DATA_DIR: &[DataDirEntry] = &[
    DataDirEntry {
        path: "functions/",
        what: "one JSON record per function",
        backup: Backup::Yes,
    },
    DataDirEntry {
        path: "modules/",
        what: "the deployed modules, content-addressed",
        backup: Backup::Yes,
    },
    DataDirEntry {
        path: "snapshots/",
        what: "snapshot records and their portable images, per function",
        backup: Backup::Yes,
    },
    DataDirEntry {
        path: "nn-models/",
        what: "models tenants stored for `wasi-nn` (records and content-addressed bytes)",
        backup: Backup::Yes,
    },
    DataDirEntry {
        path: "jobs/",
        what: "async jobs and their results",
        backup: Backup::Yes,
    },
    DataDirEntry {
        path: "tenants/",
        what: "tenants, token hashes, quotas",
        backup: Backup::Yes,
    },
    DataDirEntry {
        path: "quarantine/",
        what: "function records this build could not read (see [Storage and durability](#storage-and-durability))",
        backup: Backup::Yes,
    },
    DataDirEntry {
        path: "admin.json",
        what: "the admin token's hash",
        backup: Backup::Yes,
    },
    DataDirEntry {
        path: "credentials.json",
        what: "first-start tokens in clear (mode 0600)",
        backup: Backup::Secret,
    },
    DataDirEntry {
        path: "artifacts/",
        what: "precompiled modules and components",
        backup: Backup::No,
    },
    DataDirEntry {
        path: "snapshot-cache/",
        what: "local images of snapshots, built from `snapshots/`",
        backup: Backup::No,
    },
    DataDirEntry {
        path: "kernels/",
        what: "compiled kernels",
        backup: Backup::No,
    },
    DataDirEntry {
        path: "cuda-cache/",
        what: "the CUDA driver's JIT cache (image only)",
        backup: Backup::No,
    },
    DataDirEntry {
        path: "tmp/",
        what: "in-progress writes, emptied on start",
        backup: Backup::No,
    },
];

/// The paths a backup holds, without the trailing `/` of directories, in [`DATA_DIR`]'s
/// order: what `tar -C <data-dir> -czf backup.tgz <paths>` takes.
pub fn backup_paths() -> Vec<&'static str> {
    DATA_DIR
        .iter()
        .filter(|entry| entry.backup != Backup::No)
        .map(|entry| entry.path.trim_end_matches('/'))
        .collect()
}

/// docs/deploy.md's backup table, as [`DATA_DIR`] renders it.
pub fn markdown_table() -> String {
    let mut table = String::from("| path under the data dir | what | back up |\n|---|---|---|\n");
    for entry in DATA_DIR {
        let backup = match entry.backup {
            Backup::Yes => "yes",
            Backup::Secret => {
                "yes, and treat as a secret (or drop it once the tokens are in a secret manager)"
            }
            Backup::No => "no: a cache or scratch space, rebuilt or emptied on demand",
        };
        table.push_str(&format!(
            "| `{}` | {} | {backup} |\n",
            entry.path, entry.what
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block between `<!-- data-dir:begin -->` and `<!-- data-dir:end -->`.
    const BEGIN: &str = "<!-- data-dir:begin -->\n";
    const END: &str = "<!-- data-dir:end -->";

    #[test]
    fn deploy_md_backs_up_exactly_the_listed_paths() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/deploy.md");
        let doc = std::fs::read_to_string(&path).expect("docs/deploy.md");
        let (before, rest) = doc.split_once(BEGIN).expect("the data-dir:begin marker");
        let (block, after) = rest.split_once(END).expect("the data-dir:end marker");
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(
                &path,
                format!("{before}{BEGIN}{}{END}{after}", markdown_table()),
            )
            .expect("writing docs/deploy.md");
            return;
        }
        assert_eq!(
            block,
            markdown_table(),
            "docs/deploy.md's backup table differs from layout::DATA_DIR: regenerate it with \
             `UPDATE_DOCS=1 cargo test -p tensor-wasm-runtime layout`"
        );
        // Every tar command of the section takes exactly the paths to back up.
        let wanted = backup_paths().join(" ");
        let commands: Vec<&str> = after
            .lines()
            .filter(|line| line.contains("tar -C /data"))
            .collect();
        assert!(!commands.is_empty(), "no backup command after the table");
        for command in commands {
            assert!(
                command.trim_end().ends_with(&wanted) || command.contains(&format!("{wanted} |")),
                "a backup command does not take exactly `{wanted}`: {command}"
            );
        }
    }

    #[test]
    fn snapshots_and_jobs_are_backed_up_and_caches_are_not() {
        let paths = backup_paths();
        for kept in [
            "functions",
            "modules",
            "snapshots",
            "jobs",
            "tenants",
            "admin.json",
        ] {
            assert!(paths.contains(&kept), "{kept}");
        }
        for cache in ["artifacts", "kernels", "tmp", "snapshot-cache"] {
            assert!(!paths.contains(&cache), "{cache}");
        }
    }
}
