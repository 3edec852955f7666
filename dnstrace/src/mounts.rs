//! The filesystems mounted here, as /proc/self/mounts lists them.
use std::path::{Path, PathBuf};

use anyhow::Result;

/// (filesystem type, mount point) of each mount.
fn mounts() -> Result<Vec<(String, PathBuf)>> {
    let text = std::fs::read_to_string("/proc/self/mounts")?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().skip(1);
            let at = f.next()?;
            Some((f.next()?.to_owned(), PathBuf::from(at)))
        })
        .collect())
}

/// Where cgroup v2 is mounted: /sys/fs/cgroup, or /sys/fs/cgroup/unified
/// on a hybrid hierarchy; none where it is not.
pub fn cgroup2_root() -> Result<Option<PathBuf>> {
    Ok(mounts()?
        .into_iter()
        .find(|(fstype, _)| fstype == "cgroup2")
        .map(|(_, at)| at))
}

/// cgroup v2 at `dir`, or at `dir/unified` (a hybrid hierarchy's place):
/// a host's /sys/fs/cgroup mounted into a container, whose own mount
/// shows only its cgroup namespace.
pub fn cgroup2_at(dir: &Path) -> Result<PathBuf> {
    for at in [dir.to_path_buf(), dir.join("unified")] {
        if is_cgroup2(&at) {
            return Ok(at);
        }
    }
    anyhow::bail!(
        "neither {} nor its unified/ is a cgroup v2 mount",
        dir.display()
    )
}

fn is_cgroup2(dir: &Path) -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path and a zeroed struct the call fills.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statfs(path.as_ptr(), &mut fs) };
    rc == 0 && fs.f_type as i64 == CGROUP2_SUPER_MAGIC
}

/// Whether a filesystem of type `fstype` is mounted at `dir`.
pub fn mounted(fstype: &str, dir: &Path) -> Result<bool> {
    Ok(mounts()?.iter().any(|(t, at)| t == fstype && at == dir))
}
