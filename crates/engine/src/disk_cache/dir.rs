//! The cache's directory: file names, the writability check, and the scan at open that keeps
//! valid files (by their headers) and deletes everything else.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use super::format;
use super::{BlockHash, DiskCacheError, DiskStats};

/// `<hash>.blk`.
pub(super) fn file_name(h: BlockHash) -> String {
    format!("{h:032x}.blk")
}

/// The hash a cache file's name stands for: exactly 32 lowercase hex digits and `.blk`.
fn parse_name(name: &str) -> Option<BlockHash> {
    let hex = name.strip_suffix(".blk")?;
    if !is_hex128(hex) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok()
}

/// Whether `name` is a 128-bit value as the cache names it (files and namespace directories):
/// exactly 32 lowercase hex digits.
fn is_hex128(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The namespace directories under `root` other than `ours` (other models, KV types, or block
/// layouts of other builds), and the bytes of the files directly in them: never read by this
/// cache, and not its to delete. Best effort: what cannot be listed is left out.
pub(super) fn other_namespaces(root: &Path, ours: u128) -> (usize, u64) {
    let ours = format!("{ours:032x}");
    let Ok(entries) = fs::read_dir(root) else {
        return (0, 0);
    };
    let (mut dirs, mut bytes) = (0, 0);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !is_hex128(&name) || name == ours {
            continue;
        }
        // Not through a symlink: only directories that are the cache's own.
        if !fs::symlink_metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        dirs += 1;
        let files = fs::read_dir(entry.path()).into_iter().flatten().flatten();
        bytes += files
            .filter_map(|f| f.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum::<u64>();
    }
    (dirs, bytes)
}

/// Creates `dir` and checks a file can be written in it.
pub(super) fn prepare_dir(dir: &Path) -> Result<(), DiskCacheError> {
    fs::create_dir_all(dir).map_err(|error| {
        // "File exists" alone reads as if the directory were the problem.
        let error = match fs::metadata(dir) {
            Ok(m) if !m.is_dir() => io::Error::new(error.kind(), "a file is in its place"),
            _ => error,
        };
        DiskCacheError::Create {
            path: dir.to_path_buf(),
            error,
        }
    })?;
    // The `.tmp` suffix: if this is left behind by a crash, the next open deletes it.
    let probe = dir.join(format!(".probe.{}.tmp", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .and_then(|mut f| f.write_all(b"probe"));
    let _ = fs::remove_file(&probe);
    written.map_err(|error| DiskCacheError::Write {
        path: dir.to_path_buf(),
        error,
    })
}

/// Deletes whatever is at `path` (a directory with its contents; a symlink, not its target).
pub(super) fn remove_any(path: &Path) {
    let r = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match r {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("disk cache: cannot delete {}: {e}", path.display()),
    }
}

/// A valid cache file found at open.
pub(super) struct Found {
    pub hash: BlockHash,
    pub size: u64,
    pub mtime: SystemTime,
}

/// Checks the entry `name` of the namespace directory by its name and header.
fn check_entry(path: &Path, name: &str, namespace: u128) -> Result<Found, String> {
    let hash = parse_name(name).ok_or("not a cache file name")?;
    let meta = fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let header = format::read_header(&mut f).map_err(|e| e.to_string())?;
    header
        .check(namespace, hash, meta.len())
        .map_err(|e| e.to_string())?;
    Ok(Found {
        hash,
        size: meta.len(),
        mtime: meta.modified().unwrap_or(UNIX_EPOCH),
    })
}

/// Lists the namespace directory: valid files by their headers; everything else is deleted.
pub(super) fn scan(
    dir: &Path,
    namespace: u128,
    stats: &mut DiskStats,
) -> Result<Vec<Found>, DiskCacheError> {
    let entries = fs::read_dir(dir).map_err(|error| DiskCacheError::Read {
        path: dir.to_path_buf(),
        error,
    })?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("disk cache: cannot list {}: {e}", dir.display());
                continue;
            }
        };
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".tmp") {
            tracing::debug!(
                "disk cache: deleting {}, left by an interrupted write",
                path.display()
            );
            remove_any(&path);
            continue;
        }
        match check_entry(&path, &name, namespace) {
            Ok(f) => found.push(f),
            Err(why) => {
                tracing::warn!("disk cache: deleting {}: {why}", path.display());
                remove_any(&path);
                stats.corrupt += 1;
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_namespaces_are_counted_with_their_bytes() {
        let root = tempfile::tempdir().unwrap();
        let (ours, theirs) = (0xabu128, 0xcdu128);
        for (ns, files) in [(ours, 3), (theirs, 2)] {
            let dir = root.path().join(format!("{ns:032x}"));
            fs::create_dir(&dir).unwrap();
            for i in 0..files {
                fs::write(dir.join(file_name(i)), vec![0u8; 1000]).unwrap();
            }
        }
        // Not namespaces: a file with a namespace's name, a directory of another name.
        fs::write(root.path().join(format!("{:032x}", 0xefu128)), b"x").unwrap();
        fs::create_dir(root.path().join("notes")).unwrap();
        assert_eq!(other_namespaces(root.path(), ours), (1, 2000));
        assert_eq!(other_namespaces(root.path(), theirs), (1, 3000));
        assert_eq!(other_namespaces(&root.path().join("absent"), ours), (0, 0));
    }
}
