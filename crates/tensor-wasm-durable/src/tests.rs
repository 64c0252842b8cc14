//! Unit tests of the durable-write helper.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Barrier};

use super::*;

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn write_file_lands_the_bytes_and_leaves_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("a.json");
    write_file(&dest, b"first", &WriteOptions::new()).unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"first");
    write_file(&dest, b"second, longer", &WriteOptions::new()).unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"second, longer");
    assert_eq!(names(dir.path()), ["a.json"]);
}

#[test]
fn staging_dir_holds_the_temp_file_until_commit() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("tmp");
    let target = dir.path().join("records");
    fs::create_dir_all(&staging).unwrap();
    fs::create_dir_all(&target).unwrap();
    let dest = target.join("r.json");
    let mut file = DurableFile::create(&dest, &WriteOptions::new().staging_dir(&staging)).unwrap();
    assert_eq!(file.temp_path().parent(), Some(staging.as_path()));
    assert_eq!(file.destination(), dest);
    file.write_all(b"{}").unwrap();
    assert!(names(&target).is_empty(), "nothing visible before commit");
    file.commit().unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"{}");
    assert!(names(&staging).is_empty());
}

#[test]
fn an_abandoned_write_leaves_the_old_file_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("image");
    write_file(&dest, b"old", &WriteOptions::new()).unwrap();
    let failed = (|| -> std::io::Result<()> {
        let mut file = DurableFile::create(&dest, &WriteOptions::new())?;
        file.write_all(b"new but incomplete")?;
        Err(std::io::Error::other("the producer failed mid-way"))
    })();
    assert!(failed.is_err());
    assert_eq!(fs::read(&dest).unwrap(), b"old");
    assert_eq!(names(dir.path()), ["image"]);
}

#[test]
fn a_failed_rename_removes_the_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    // A non-empty directory cannot be replaced by a file.
    let dest = dir.path().join("occupied");
    fs::create_dir_all(dest.join("inside")).unwrap();
    let err = write_file(&dest, b"bytes", &WriteOptions::new()).unwrap_err();
    assert_eq!(err.step(), Step::Rename);
    assert_eq!(err.path(), dest);
    assert!(err.to_string().contains("occupied"), "{err}");
    assert_eq!(names(dir.path()), ["occupied"]);
}

#[test]
fn a_missing_directory_is_reported_with_the_temp_path() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("missing").join("x");
    let err = write_file(&dest, b"bytes", &WriteOptions::new()).unwrap_err();
    assert_eq!(err.step(), Step::CreateTemp);
    assert_eq!(err.path().parent(), dest.parent());
    assert_eq!(err.io_error().kind(), std::io::ErrorKind::NotFound);
    let io: std::io::Error = err.into();
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn a_destination_without_a_file_name_is_refused() {
    let err = write_file("/", b"x", &WriteOptions::new()).unwrap_err();
    assert_eq!(err.step(), Step::CreateTemp);
    assert_eq!(err.io_error().kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn concurrent_writers_leave_one_complete_file() {
    const WRITERS: usize = 8;
    const LEN: usize = 256 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let dest = Arc::new(dir.path().join("shared.bin"));
    let barrier = Arc::new(Barrier::new(WRITERS));
    let threads: Vec<_> = (0..WRITERS)
        .map(|i| {
            let (dest, barrier) = (dest.clone(), barrier.clone());
            std::thread::spawn(move || {
                let bytes = vec![i as u8 + 1; LEN];
                barrier.wait();
                write_file(dest.as_path(), &bytes, &WriteOptions::new()).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let bytes = fs::read(dest.as_path()).unwrap();
    assert_eq!(bytes.len(), LEN);
    assert!((1..=WRITERS as u8).contains(&bytes[0]));
    assert!(bytes.iter().all(|&b| b == bytes[0]), "a mix of writers");
    assert_eq!(names(dir.path()), ["shared.bin"]);
}

#[cfg(unix)]
#[test]
fn positioned_writes_make_a_sparse_file() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("sparse");
    let mut file = DurableFile::create(&dest, &WriteOptions::new()).unwrap();
    file.write_all(b"head").unwrap();
    file.file().set_len(1 << 20).unwrap();
    file.file().write_all_at(b"tail", (1 << 20) - 4).unwrap();
    file.commit().unwrap();
    let bytes = fs::read(&dest).unwrap();
    assert_eq!(bytes.len(), 1 << 20);
    assert_eq!(&bytes[..4], b"head");
    assert_eq!(&bytes[(1 << 20) - 4..], b"tail");
    assert!(bytes[4..(1 << 20) - 4].iter().all(|&b| b == 0));
}

#[cfg(unix)]
#[test]
fn mode_is_honoured() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("private.json");
    write_file(&private, b"{}", &WriteOptions::new().mode(0o600)).unwrap();
    let mode = fs::metadata(&private).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // Without a mode the usual default applies (0666 less the umask): group or others
    // get at least read access under any common umask.
    let public = dir.path().join("public.json");
    write_file(&public, b"{}", &WriteOptions::new()).unwrap();
    let mode = fs::metadata(&public).unwrap().permissions().mode();
    assert_ne!(mode & 0o077, 0, "{mode:o}");
}

#[test]
fn remove_temp_files_removes_only_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let keep = [
        "a.ptx",
        "a.partial",
        ".hidden",
        ".a.ptx.partial",
        ".a.ptx.12-x.partial",
        ".a.12-3.json",
    ];
    for name in keep {
        fs::write(dir.path().join(name), b"keep").unwrap();
    }
    // What a crashed writer leaves behind.
    let leftover = DurableFile::create(dir.path().join("a.ptx"), &WriteOptions::new()).unwrap();
    let temp = leftover.temp_path().to_owned();
    std::mem::forget(leftover);
    fs::write(dir.path().join(".b.cwasm.99-7.partial"), b"stale").unwrap();
    assert!(temp.exists());

    assert_eq!(remove_temp_files(dir.path()).unwrap(), 2);
    let mut expected: Vec<&str> = keep.to_vec();
    expected.sort();
    assert_eq!(names(dir.path()), expected);
}

#[test]
fn temp_names_are_recognised() {
    assert!(file::is_temp_name(OsStr::new(".x.json.1-0.partial")));
    assert!(!file::is_temp_name(OsStr::new("..1-0.partial")));
    assert!(!file::is_temp_name(OsStr::new(".x.json.1-.partial")));
    assert!(!file::is_temp_name(OsStr::new("x.json.1-0.partial")));
}

#[test]
fn sync_dir_reports_a_missing_directory() {
    let dir = tempfile::tempdir().unwrap();
    sync_dir(dir.path()).unwrap();
    let err = sync_dir(dir.path().join("gone")).unwrap_err();
    assert_eq!(err.step(), Step::SyncDir);
    assert!(err.to_string().contains("gone"), "{err}");
}

#[test]
fn create_dir_all_makes_every_missing_level_and_accepts_an_existing_one() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("snapshots").join("fn-1").join("inner");
    create_dir_all(&deep).unwrap();
    assert!(deep.is_dir());
    create_dir_all(&deep).unwrap();
    // A file in the way is an error naming the step.
    let blocked = dir.path().join("file");
    fs::write(&blocked, b"x").unwrap();
    let err = create_dir_all(blocked.join("below")).unwrap_err();
    assert_eq!(err.step(), Step::CreateDir);
}

#[test]
fn concurrent_create_dir_all_of_one_directory_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let target = Arc::new(dir.path().join("a").join("b").join("c"));
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (target, barrier) = (target.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                create_dir_all(target.as_path())
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap().unwrap();
    }
    assert!(target.is_dir());
}

/// Two stores staging in one directory (the function and tenant stores share `tmp/`) get
/// different temporary files even for destinations with the same name, and a temporary
/// name already taken (a crashed process with the same id) is skipped, never truncated.
#[test]
fn stores_sharing_a_staging_dir_never_share_a_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("tmp");
    fs::create_dir(&staging).unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    let options = WriteOptions::new().staging_dir(&staging);
    let mut first = DurableFile::create(a.join("x.json"), &options).unwrap();
    let mut second = DurableFile::create(b.join("x.json"), &options).unwrap();
    assert_ne!(first.temp_path(), second.temp_path());
    first.write_all(b"first").unwrap();
    second.write_all(b"second").unwrap();
    first.commit().unwrap();
    second.commit().unwrap();
    assert_eq!(fs::read(a.join("x.json")).unwrap(), b"first");
    assert_eq!(fs::read(b.join("x.json")).unwrap(), b"second");
    assert!(names(&staging).is_empty());
}
