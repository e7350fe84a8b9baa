//! Durable directories. POSIX makes a new directory entry (a file's or a directory's) durable
//! only once the directory holding it is fsynced. Everything that creates a directory under
//! the data dir goes through [`create_dir_all_durable`] before anything stored in it is
//! acknowledged, and every directory fsync goes through [`sync_dir`], the one seam a test
//! can watch ([`record_dir_syncs`]).

use std::cell::RefCell;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

thread_local! {
    /// Directories fsynced on this thread while a [`record_dir_syncs`] call runs.
    static RECORDED: RefCell<Option<Vec<PathBuf>>> = const { RefCell::new(None) };
}

/// fsyncs a directory: the entries created, renamed or removed in it become durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    RECORDED.with(|r| {
        if let Some(v) = r.borrow_mut().as_mut() {
            v.push(dir.to_path_buf());
        }
    });
    File::open(dir)?.sync_all()
}

/// Creates `dir` and its missing ancestors (as `fs::create_dir_all`), then fsyncs, deepest
/// first, every directory it created and the ancestor that already existed, so that the
/// whole new path survives a power loss. When `dir` already existed it fsyncs `dir` and its
/// parent: a process killed before its own fsyncs leaves entries that only the page cache
/// holds, and its successor must not acknowledge anything on top of them unsynced.
pub fn create_dir_all_durable(dir: &Path) -> io::Result<()> {
    // The deepest ancestor (or `dir` itself) that exists; what lies below it is created here.
    let mut missing = Vec::new();
    let mut existing = Some(dir);
    while let Some(d) = existing {
        if d.as_os_str().is_empty() || d.is_dir() {
            break;
        }
        missing.push(d);
        existing = d.parent();
    }
    fs::create_dir_all(dir)?;
    let mut to_sync: Vec<&Path> = if missing.is_empty() {
        vec![dir]
    } else {
        missing
    };
    let top = *to_sync.last().expect("invariant: at least `dir`");
    match top.parent() {
        // A relative path with one component: its parent is the working directory.
        Some(p) if p.as_os_str().is_empty() => to_sync.push(Path::new(".")),
        Some(p) => to_sync.push(p),
        None => {}
    }
    for d in to_sync {
        sync_dir(d)?;
    }
    Ok(())
}

/// Replaces the file at `path` with `bytes` whole: a temporary file beside it (`<name>.tmp`),
/// fdatasynced, renamed over it, then the directory fsynced. A crash leaves the old file or
/// the new one, never a mix.
pub fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_data()?;
    fs::rename(&tmp, path)?;
    sync_dir(dir)
}

/// Runs `f` and returns, with its result, the directories fsynced on this thread meanwhile
/// (in order). For tests that check what a component makes durable.
pub fn record_dir_syncs<R>(f: impl FnOnce() -> R) -> (R, Vec<PathBuf>) {
    let outer = RECORDED.with(|r| r.borrow_mut().replace(Vec::new()));
    let out = f();
    let got = RECORDED.with(|r| r.borrow_mut().take()).unwrap_or_default();
    if let Some(mut outer) = outer {
        // Nested recordings: the outer one sees these too.
        outer.extend(got.iter().cloned());
        RECORDED.with(|r| *r.borrow_mut() = Some(outer));
    }
    (out, got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_path_is_synced_from_its_deepest_directory_to_the_existing_ancestor() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let leaf = root.join("topics/7/0");
        let (r, synced) = record_dir_syncs(|| create_dir_all_durable(&leaf));
        r.unwrap();
        assert!(leaf.is_dir());
        assert_eq!(
            synced,
            vec![
                root.join("topics/7/0"),
                root.join("topics/7"),
                root.join("topics"),
                root.to_path_buf(),
            ]
        );
    }

    #[test]
    fn an_existing_directory_is_synced_with_its_parent() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ingress");
        fs::create_dir(&dir).unwrap();
        let (r, synced) = record_dir_syncs(|| create_dir_all_durable(&dir));
        r.unwrap();
        assert_eq!(synced, vec![dir.clone(), tmp.path().to_path_buf()]);
    }

    #[test]
    fn a_file_in_the_way_fails_and_syncs_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        fs::write(&file, b"x").unwrap();
        let (r, synced) = record_dir_syncs(|| create_dir_all_durable(&file.join("d")));
        assert!(r.is_err());
        assert!(synced.is_empty());
    }

    #[test]
    fn a_replaced_file_holds_the_new_bytes_and_its_directory_is_synced() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("delays");
        fs::write(&path, b"old and longer").unwrap();
        let (r, synced) = record_dir_syncs(|| replace_file(&path, b"new"));
        r.unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert!(!tmp.path().join("delays.tmp").exists());
        assert_eq!(synced, vec![tmp.path().to_path_buf()]);
    }

    #[test]
    fn recordings_nest_and_stop() {
        let tmp = tempfile::tempdir().unwrap();
        let (inner, outer) = record_dir_syncs(|| {
            let ((), inner) = record_dir_syncs(|| sync_dir(tmp.path()).unwrap());
            inner
        });
        assert_eq!(inner, vec![tmp.path().to_path_buf()]);
        assert_eq!(outer, vec![tmp.path().to_path_buf()]);
        sync_dir(tmp.path()).unwrap();
        let ((), none) = record_dir_syncs(|| ());
        assert!(none.is_empty());
    }
}
