//! Child processes: their output kept, killed and reaped on every exit path,
//! their CPU and memory read from /proc.
use super::*;

pub(super) enum Capture {
    Discard,
    /// stderr's lines, each with when it came.
    Lines,
    /// stdout's lines instead (stderr discarded).
    Stdout,
    /// stderr's lines, with stdin and stdout on this terminal (`terminal`).
    Terminal(OwnedFd),
}

/// A child process, killed and reaped if still there when dropped.
pub(super) struct Proc {
    pub(super) name: &'static str,
    pub(super) pid: i32,
    pub(super) _child: Child,
    pub(super) reaped: bool,
    pub(super) lines: Arc<Mutex<Vec<(Instant, String)>>>,
    pub(super) reader: Option<JoinHandle<()>>,
}

pub(super) struct Ended {
    pub(super) code: Option<i32>,
    /// User + system seconds, from wait4.
    pub(super) cpu: f64,
    /// The captured stream's lines.
    pub(super) output: String,
}

impl Proc {
    pub(super) fn spawn(name: &'static str, cmd: &mut Command, capture: Capture) -> Result<Self> {
        let piped = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
        match &capture {
            Capture::Terminal(tty) => {
                cmd.stdin(Stdio::from(tty.try_clone()?));
                cmd.stdout(Stdio::from(tty.try_clone()?));
            }
            _ => {
                cmd.stdin(Stdio::null());
                cmd.stdout(piped(matches!(capture, Capture::Stdout)));
            }
        }
        cmd.stderr(piped(matches!(
            capture,
            Capture::Lines | Capture::Terminal(_)
        )));
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stream: Option<Box<dyn std::io::Read + Send>> = match capture {
            Capture::Discard => None,
            Capture::Lines | Capture::Terminal(_) => child.stderr.take().map(|e| Box::new(e) as _),
            Capture::Stdout => child.stdout.take().map(|o| Box::new(o) as _),
        };
        let reader = stream.map(|stream| {
            let lines = lines.clone();
            thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push((Instant::now(), line));
                }
            })
        });
        Ok(Self {
            name,
            pid: child.id() as i32,
            _child: child,
            reaped: false,
            lines,
            reader,
        })
    }

    pub(super) fn captured(&self) -> String {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| format!("{l}\n"))
            .collect()
    }

    /// When a stderr line containing `pat` came.
    pub(super) fn wait_line(&self, pat: &str, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((at, _)) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|(_, l)| l.contains(pat))
            {
                return Ok(*at);
            }
            if !alive(self.pid) {
                sleep(Duration::from_millis(50));
                bail!(
                    "{} ended before saying {pat:?}: {}",
                    self.name,
                    self.captured().trim()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not say {pat:?} within {timeout:?}: {}",
                    self.name,
                    self.captured().trim()
                );
            }
            pause(Duration::from_millis(5))?;
        }
    }

    pub(super) fn stop(self, signal: i32, grace: Duration) -> Result<Ended> {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.pid, signal) };
        self.wait(grace)
    }

    /// Waits for the end (killing it after `limit`), with its CPU time.
    pub(super) fn wait(mut self, limit: Duration) -> Result<Ended> {
        let deadline = Instant::now() + limit;
        let mut killed = false;
        loop {
            let mut status = 0;
            // SAFETY: zeroed rusage is a valid out-parameter.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: wait4 on our own child, with valid pointers.
            let r = unsafe { libc::wait4(self.pid, &mut status, libc::WNOHANG, &mut ru) };
            if r == self.pid {
                self.reaped = true;
                if let Some(reader) = self.reader.take() {
                    let _ = reader.join();
                }
                let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
                let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
                if killed {
                    bail!("{} did not end within {limit:?}; killed", self.name);
                }
                return Ok(Ended {
                    code,
                    cpu: secs(ru.ru_utime) + secs(ru.ru_stime),
                    output: self.captured(),
                });
            }
            if r < 0 {
                bail!(
                    "waiting for {}: {}",
                    self.name,
                    std::io::Error::last_os_error()
                );
            }
            if !killed && Instant::now() > deadline {
                // SAFETY: as above.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
                killed = true;
            }
            sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: kill and reap our own child.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// A new terminal of `cols` × `rows`: its far end, for a child's stdin
/// and stdout. What the child draws is read and thrown away until the
/// last far end closes, so that drawing never blocks.
pub(super) fn terminal(cols: u16, rows: u16) -> Result<OwnedFd> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: valid out-pointers; no name buffer or termios asked for.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("opening a terminal (openpty)");
    }
    // SAFETY: two fresh descriptors, owned by nothing else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut screen = File::from(master);
    thread::spawn(move || {
        let mut buf = [0; 16384];
        while screen.read(&mut buf).is_ok_and(|n| n > 0) {}
    });
    Ok(slave)
}

pub(super) fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

pub(super) fn status_kib(pid: i32, key: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("no {key} in /proc/{pid}/status"))
}

// ---------------------------------------------------------------- the lab

/// A process's user + system seconds so far, all threads.
pub(super) fn proc_cpu(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| -> Result<f64> {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| anyhow!("short /proc/{pid}/stat"))
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // utime and stime: fields 14 and 15, counted from the state (field 3).
    Ok((ticks(11)? + ticks(12)?) / hz)
}
