//! The lab: its machine-wide lock, bringing it up and down, and running
//! things inside its network namespaces.
use super::*;

/// The machine-wide lab lock (the test suite takes it too), held until drop.
pub(super) struct LabLock {
    pub(super) _file: File,
}

impl LabLock {
    pub(super) fn acquire() -> Result<Self> {
        Ok(Self {
            _file: crate::lock_exclusive(LOCK)?,
        })
    }
}

/// The lab, brought down when dropped (errors and Ctrl-C included).
pub(super) struct Lab(pub(super) PathBuf);

impl Lab {
    /// `lab up` with `args` (none: the single node), after `lab down`.
    pub(super) fn up(bin: &Path, args: &[&str]) -> Result<Self> {
        let _ = Command::new(bin).args(["lab", "down"]).output();
        let lab = Self(bin.to_owned());
        let out = Command::new(bin)
            .args(["lab", "up"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running dnstrace lab up")?;
        if !out.status.success() {
            bail!(
                "dnstrace lab up failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(lab)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        step("removing the lab (dnstrace lab down)");
        let _ = Command::new(&self.0).args(["lab", "down"]).status();
    }
}

/// The node's veths: the pods' host ends and the uplink.
pub(super) fn node_veths() -> Result<Vec<String>> {
    let out = output(Command::new("ip").args(["-n", NODE, "-o", "link", "show", "type", "veth"]))?;
    let names: Vec<String> = out
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .collect();
    if names.is_empty() {
        bail!("no veths in {NODE}");
    }
    Ok(names)
}

pub(super) fn wait_listening(ns: &str, ss_flags: &str, port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = output(Command::new("ip").args([
            "netns",
            "exec",
            ns,
            "ss",
            ss_flags,
            "sport",
            "=",
            &format!(":{port}"),
        ]))?;
        if !out.trim().is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("nothing listens on port {port} in {ns}");
        }
        pause(Duration::from_millis(50))?;
    }
}

pub(super) fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        // iperf3 -J, for one, says what went wrong on stdout.
        let said = if out.stderr.is_empty() {
            &out.stdout
        } else {
            &out.stderr
        };
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(said).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

// ---------------------------------------------------------------- load

/// Runs `f` on a thread of its own inside the lab namespace `ns`.
pub(super) fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> JoinHandle<Result<T>> {
    let path = format!("/run/netns/{ns}");
    thread::spawn(move || {
        let file = File::open(&path).with_context(|| format!("opening {path}"))?;
        // SAFETY: setns on this thread only, with a namespace fd we own.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("entering {path}: {}", std::io::Error::last_os_error());
        }
        f()
    })
}
