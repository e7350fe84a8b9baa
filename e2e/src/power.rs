//! Simulated power loss: a node's data dir on its own ext4 file system, an image file
//! mounted through a loop device, so that the test can take what the "disk" holds at one
//! instant and boot the node on that alone.
//!
//! [`PowerLab::cut`] pulls the plug:
//! 1. SIGSTOP the node and wait until every thread is stopped: nothing more is written and no
//!    file is closed (closing can start writeback, which a power loss would not).
//! 2. Copy the image file. It holds every write the file system has sent to its device and
//!    nothing that only the page cache holds: data written but neither fsynced nor written
//!    back yet is missing from the copy, as it would be after a power loss. (The loop device
//!    has no volatile cache of its own, so writes it got but that no flush covered survive
//!    here where a real disk might drop them; the page cache, where the node's unsynced
//!    writes live, is what this models.)
//! 3. SIGKILL the node, unmount the live file system and throw it away.
//! 4. Check the copy with `e2fsck -fy` as a boot would (replaying the journal, or, without
//!    one, repairing what the missing writes left inconsistent) and mount it in its place.
//!
//! Kernel writeback of data dirtied more than `vm.dirty_expire_centisecs` ago (30 s by
//! default) and, with a journal, its commits every 5 s still reach the copy, as they would
//! reach a real disk. [`FsKind::NoJournal`] (like this machine's root file system) is the
//! stricter of the two: without a journal, a file's size, a rename or a deletion reaches
//! the disk only when something fsyncs it. Either way ext4 writes a new file's directory
//! entries (and those of new parent directories) with the file's own fsync, so a missing
//! directory fsync is not seen here; `narad_storage::dirs` checks those through its seam.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use narad_tests::Server;

use crate::run;

/// The file system under the node's data dir.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsKind {
    /// ext4 with its journal (`data=ordered`): the usual persistent volume.
    Journaled,
    /// ext4 without a journal: metadata is written only by an fsync or by writeback.
    NoJournal,
}

/// One node's disk as an image file, mounted at [`PowerLab::mount_point`].
pub struct PowerLab {
    dir: tempfile::TempDir,
    kind: FsKind,
    mounted: bool,
}

fn have(tool: &str) -> bool {
    crate::have(tool, "-V")
}

/// What this machine lacks for a [`PowerLab`] (root, loop devices, e2fsprogs), if anything;
/// tests skip with this reason unless `NARAD_REQUIRE_LOOP=1` (as CI sets) makes it a failure.
pub fn missing_prerequisite() -> Option<String> {
    let missing: Vec<&str> = [
        (!crate::running_as_root()).then_some("root (mounting loop devices)"),
        (!Path::new("/dev/loop-control").exists()).then_some("loop devices (/dev/loop-control)"),
        (!have("mkfs.ext4") || !have("e2fsck")).then_some("e2fsprogs"),
        (!have("mount")).then_some("mount (Debian package mount)"),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!missing.is_empty()).then(|| format!("this machine lacks {}", missing.join(", ")))
}

/// Whether a test that needs a [`PowerLab`] must run here: `false` (and the reason printed)
/// when the machine lacks a prerequisite and `NARAD_REQUIRE_LOOP=1` is not set; panics when
/// it lacks one and the variable is set.
pub fn available(test: &str) -> bool {
    crate::lab_available(test, missing_prerequisite(), "NARAD_REQUIRE_LOOP")
}

/// Whether every thread of `pid` is stopped (state `T` or `t`), or the process is gone.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
            })
            .is_none_or(|state| state == "T" || state == "t")
    })
}

impl PowerLab {
    /// A fresh `size_mb` ext4 image of `kind`, mounted.
    pub fn create(kind: FsKind, size_mb: u64) -> anyhow::Result<PowerLab> {
        let dir = tempfile::Builder::new().prefix("narad-power-").tempdir()?;
        let lab = PowerLab {
            dir,
            kind,
            mounted: false,
        };
        std::fs::create_dir(lab.mount_point())?;
        let image = lab.image();
        std::fs::File::create(&image)?.set_len(size_mb << 20)?;
        let img = image.to_str().context("image path")?;
        match kind {
            FsKind::Journaled => run(&["mkfs.ext4", "-q", "-F", img])?,
            FsKind::NoJournal => run(&["mkfs.ext4", "-q", "-F", "-O", "^has_journal", img])?,
        };
        let mut lab = lab;
        lab.mount()?;
        Ok(lab)
    }

    fn image(&self) -> PathBuf {
        self.dir.path().join("disk.img")
    }

    /// Where the file system is mounted; the node's data dir goes below it.
    pub fn mount_point(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    pub fn kind(&self) -> FsKind {
        self.kind
    }

    fn mount(&mut self) -> anyhow::Result<()> {
        let img = self.image();
        let mnt = self.mount_point();
        run(&[
            "mount",
            "-o",
            "loop",
            img.to_str().context("image path")?,
            mnt.to_str().context("mount path")?,
        ])?;
        self.mounted = true;
        Ok(())
    }

    fn unmount(&mut self) -> anyhow::Result<()> {
        if self.mounted {
            run(&["umount", self.mount_point().to_str().context("mount path")?])?;
            self.mounted = false;
        }
        Ok(())
    }

    /// Pulls the plug on `server` (whose data dir is below [`Self::mount_point`]) and puts
    /// back the disk as the power loss left it, checked by `e2fsck`; the caller restarts the
    /// server.
    pub fn cut(&mut self, server: &mut Server) -> anyhow::Result<Fsck> {
        let pid = server.pid().context("the server is not running")?;
        server
            .signal(libc::SIGSTOP)
            .with_context(|| format!("SIGSTOP to {pid}"))?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !all_threads_stopped(pid) {
            if Instant::now() >= deadline {
                bail!("narad (pid {pid}) did not stop within 5 s of SIGSTOP");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let snapshot = self.dir.path().join("cut.img");
        let (img, snap) = (
            self.image().to_str().context("image path")?.to_string(),
            snapshot.to_str().context("snapshot path")?.to_string(),
        );
        run(&["cp", "--sparse=always", &img, &snap])?;
        server.kill9();
        self.unmount()?;
        std::fs::rename(&snapshot, self.image())?;
        // e2fsck exits 1 when it corrected errors and 2 when it asks for a reboot (of a
        // mounted root): both leave a usable file system. 4 and up leave errors.
        let out = Command::new("e2fsck").args(["-fy", &img]).output()?;
        let code = out.status.code().unwrap_or(8);
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if code >= 4 {
            bail!("e2fsck left errors (exit {code}):\n{report}");
        }
        self.mount()?;
        Ok(Fsck { code, report })
    }
}

/// What `e2fsck -fy` said of the disk a cut left.
#[derive(Debug)]
pub struct Fsck {
    /// 0: clean; 1: it replayed the journal or corrected errors; 2: as 1, asking for a
    /// reboot.
    pub code: i32,
    /// Its output.
    pub report: String,
}

impl Drop for PowerLab {
    fn drop(&mut self) {
        if self.mounted {
            // Lazily, so that a test failing with the node still running leaves no mount
            // behind once the node is gone.
            let mnt = self.mount_point();
            let mnt = mnt.to_string_lossy();
            if run(&["umount", &mnt]).is_err() {
                let _ = run(&["umount", "-l", &mnt]);
            }
        }
    }
}
