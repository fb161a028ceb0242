//! How a replica's directory appears and goes whole: it is built in a staging directory
//! beside it (`.new-<id>`, `.copy-<id>`, `.clone-<id>`) and renamed into place, and deleted by
//! being renamed away first (`.deleted-<id>`). Names starting with a dot are no replica's, and a
//! tablet server's start removes them, so a crash never leaves half a replica that the next
//! start would open.

use std::path::{Path, PathBuf};

use crate::Result;

/// Where a replica in `tablets` stages clone `target` of its tablet: a directory that a
/// server's start removes (an unclaimed clone holds nothing acknowledged).
pub fn clone_staging_dir(tablets: &Path, target: &str) -> PathBuf {
    beside(&tablets.join(target), "clone")
}

/// The directory named `.{kind}-{name}` next to `dir` (named `name`): where a replica's
/// directory is built before it appears, or goes before it is deleted. Names starting with a
/// dot are no replica's; a tablet server's start removes them (see [`remove_staging`]).
pub fn beside(dir: &Path, kind: &str) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    dir.with_file_name(format!(".{kind}-{name}"))
}

/// Makes the replica directory `dir` appear whole: `build` fills a staging directory beside
/// it, which is then renamed to `dir` (and the rename made durable). A crash leaves either no
/// `dir` or a complete one, never half a replica that the next start cannot open.
pub(super) fn build_in_place(dir: &Path, build: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let staging = beside(dir, "new");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    std::fs::create_dir_all(&staging)?;
    let built = build(&staging).and_then(|()| place(&staging, dir));
    if built.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    built
}

/// Renames the complete replica directory `staging` to `dir`, durably: its own entries (the
/// data directory, the log, the peers) first, then the rename.
pub(super) fn place(staging: &Path, dir: &Path) -> Result<()> {
    std::fs::File::open(staging)?.sync_all()?;
    std::fs::rename(staging, dir)?;
    sync_parent(dir)
}

fn sync_parent(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Deletes the replica directory `dir`, if there is one, in a way a crash cannot leave half
/// done: it is first renamed away (a name the next start removes), then removed.
pub fn discard(dir: &Path) -> Result<()> {
    let trash = beside(dir, "deleted");
    if trash.exists() {
        std::fs::remove_dir_all(&trash)?;
    }
    match std::fs::rename(dir, &trash) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    sync_parent(dir)?;
    std::fs::remove_dir_all(&trash)?;
    Ok(())
}

/// Removes what a crash left in `tablets` next to the replicas' directories: replicas half
/// built (a creation, a tablet copy, a clone no replica was made of) or half deleted. Nothing
/// in them was acknowledged as a replica of this server.
pub fn remove_staging(tablets: &Path) -> Result<()> {
    for entry in std::fs::read_dir(tablets)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with('.') && entry.file_type()?.is_dir() {
            tracing::info!(dir = %entry.path().display(), "removing a replica directory a crash left half made");
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_directories_are_dot_names_beside_the_replica() {
        let tablets = Path::new("/data/tablets");
        assert_eq!(
            beside(&tablets.join("t1"), "new"),
            Path::new("/data/tablets/.new-t1")
        );
        assert_eq!(
            clone_staging_dir(tablets, "t2"),
            Path::new("/data/tablets/.clone-t2")
        );
    }

    /// A replica directory built in place appears with what was built; a build that fails
    /// leaves neither the directory nor its staging; what a crash left staged is replaced.
    #[test]
    fn a_replica_directory_appears_whole_or_not_at_all() {
        let tablets = tempfile::tempdir().unwrap();
        let dir = tablets.path().join("t");
        std::fs::create_dir_all(beside(&dir, "new").join("stale")).unwrap();
        build_in_place(&dir, |staging| {
            Ok(std::fs::write(staging.join("peers.json"), "{}")?)
        })
        .unwrap();
        assert!(dir.join("peers.json").exists());
        assert!(!dir.join("stale").exists());
        assert!(!beside(&dir, "new").exists());

        let failed = tablets.path().join("u");
        let built = build_in_place(&failed, |staging| {
            std::fs::write(staging.join("half"), "x")?;
            Err(crate::EngineError::Unsupported("disk full".into()))
        });
        assert!(built.is_err());
        assert!(!failed.exists());
        assert!(!beside(&failed, "new").exists());
    }

    #[test]
    fn discard_deletes_a_replica_directory_and_ignores_a_missing_one() {
        let tablets = tempfile::tempdir().unwrap();
        let dir = tablets.path().join("t");
        discard(&dir).unwrap();
        std::fs::create_dir_all(dir.join("data")).unwrap();
        discard(&dir).unwrap();
        assert!(!dir.exists());
        assert!(!beside(&dir, "deleted").exists());
    }

    /// A start removes the directories a crash left half made or half deleted, and nothing
    /// else: not replicas, not files.
    #[test]
    fn remove_staging_removes_only_staging_directories() {
        let tablets = tempfile::tempdir().unwrap();
        let replica = tablets.path().join("t1");
        std::fs::create_dir_all(&replica).unwrap();
        for kind in ["new", "copy", "clone", "deleted"] {
            std::fs::create_dir_all(beside(&tablets.path().join("t2"), kind).join("data")).unwrap();
        }
        std::fs::write(tablets.path().join(".not-a-directory"), "x").unwrap();
        remove_staging(tablets.path()).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(tablets.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".not-a-directory", "t1"]);
    }
}
