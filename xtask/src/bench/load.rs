//! The load: iperf3, dnsperf, and a blackhole resolver with a sender of
//! never-answered queries, all inside the lab's namespaces.
use super::*;

/// iperf3 from default/web to shop/checkout: bits per second received.
pub(super) fn iperf3(secs: u32) -> Result<f64> {
    interrupted()?;
    let out = output(
        Command::new("ip")
            .args(["netns", "exec", WEB])
            .args(pinned(0))
            .args([
                "iperf3",
                "-c",
                CHECKOUT_IP,
                "-t",
                &secs.to_string(),
                "-O",
                "1",
                "-J",
            ]),
    )?;
    let v: serde_json::Value = serde_json::from_str(&out).context("iperf3's JSON")?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow!("no end.sum_received.bits_per_second in iperf3's output"))
}

pub(super) struct PerfResult {
    pub(super) sent: u64,
    pub(super) completed: u64,
    pub(super) lost: u64,
    pub(super) qps: f64,
}

impl std::fmt::Display for PerfResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dnsperf: {} qps, {} sent, {} completed, {} lost",
            thousands(self.qps),
            self.sent,
            self.completed,
            self.lost
        )
    }
}

/// dnsperf from default/web to kube-dns; `rate` None is as fast as answers come.
pub(super) fn dnsperf_cmd(queries: &Path, secs: u32, rate: Option<u32>) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", WEB, "dnsperf", "-s", SERVICE, "-d"])
        .arg(queries)
        .args(["-l", &secs.to_string(), "-c", DNSPERF_CLIENTS, "-t", "2"]);
    match rate {
        Some(r) => cmd.args(["-Q", &r.to_string(), "-q", "5000"]),
        None => cmd.args(["-q", DNSPERF_OUTSTANDING]),
    };
    cmd
}

pub(super) fn dnsperf(queries: &Path, secs: u32, rate: Option<u32>) -> Result<PerfResult> {
    interrupted()?;
    parse_dnsperf(&output(&mut dnsperf_cmd(queries, secs, rate))?)
}

pub(super) fn parse_dnsperf(out: &str) -> Result<PerfResult> {
    let field = |key: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
            .ok_or_else(|| anyhow!("no {key:?} in dnsperf's output:\n{out}"))
    };
    Ok(PerfResult {
        sent: field("Queries sent:")? as u64,
        completed: field("Queries completed:")? as u64,
        lost: field("Queries lost:")? as u64,
        qps: field("Queries per second:")?,
    })
}

/// `taskset -c CPU` where the machine has two CPUs or more: iperf3's client
/// and server on CPUs of their own vary less from run to run.
pub(super) fn pinned(cpu: usize) -> Vec<String> {
    if thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        vec!["taskset".into(), "-c".into(), cpu.to_string()]
    } else {
        Vec::new()
    }
}

/// A resolver that reads every query and never answers, in shop/checkout.
pub(super) fn blackhole(
    stop: Arc<AtomicBool>,
) -> (JoinHandle<Result<u64>>, mpsc::Receiver<Result<()>>) {
    let (tx, rx) = mpsc::channel();
    let handle = in_netns(CHECKOUT, move || {
        let sock = match UdpSocket::bind((CHECKOUT_IP, 53)) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Err(anyhow!("binding {CHECKOUT_IP}:53: {e}")));
                return Err(e.into());
            }
        };
        let size: libc::c_int = 32 << 20;
        // SAFETY: setsockopt with a valid int option value.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        let _ = tx.send(Ok(()));
        let mut buf = [0u8; 2048];
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            match sock.recv(&mut buf) {
                Ok(_) => n += 1,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n)
    });
    (handle, rx)
}

/// Queries for distinct names from default/web to the blackhole, `rate` a
/// second for `duration`, from 16 sockets.
pub(super) fn sender(
    rate: u32,
    duration: Duration,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<u64>> {
    in_netns(WEB, move || {
        let socks = (0..16)
            .map(|_| {
                let s = UdpSocket::bind("0.0.0.0:0")?;
                s.connect((CHECKOUT_IP, 53))?;
                Ok(s)
            })
            .collect::<Result<Vec<_>>>()?;
        let start = Instant::now();
        let mut sent = 0u64;
        while !stop.load(Ordering::SeqCst) && start.elapsed() < duration {
            let due = (start.elapsed().as_secs_f64() * f64::from(rate)) as u64;
            while sent < due {
                let sock = &socks[(sent % 16) as usize];
                sock.send(&query(sent))?;
                sent += 1;
            }
            sleep(Duration::from_millis(2));
        }
        Ok(sent)
    })
}

/// A DNS query (RD, one question, A) for a name of its own.
pub(super) fn query(n: u64) -> Vec<u8> {
    let id = ((n / 16) & 0xffff) as u16;
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in [
        format!("n{n}"),
        "inflight".into(),
        "example".into(),
        "com".into(),
    ] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

// ---------------------------------------------------------------- BPF stats
