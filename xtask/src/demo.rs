//! A first look without a cluster: dnstrace on the server side of a veth pair
//! between two throw-away network namespaces, while dig asks dnsmasq a few
//! questions (plus one garbage packet). Everything is removed at the end.
use std::{
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use dnstrace_tests::{dnsmasq, query_bytes, udp_exchange, Pair, Proc};

use crate::{cargo, setup::is_root, workspace_root};

const QUESTIONS: &[&str] = &[
    "www.test A",
    "www.test AAAA",
    "alias.test A",
    "missing.test A",
    "+tcp www.test A",
    "+noedns big.test TXT",
];

pub fn run() -> Result<()> {
    if !is_root() {
        bail!("the demo loads eBPF programs and makes network namespaces: run `sudo cargo xtask demo`");
    }
    cargo(&["build", "--release", "--quiet", "--package", "dnstrace"])?;
    let pair = Pair::new()?;
    let big = format!("--txt-record=big.test,{0},{0},{0}", "x".repeat(200));
    let zone = [
        "--local=/test/",
        "--host-record=www.test,10.77.0.80,fd77::80",
        "--cname=alias.test,www.test",
        &big,
    ];
    let _dns = dnsmasq(&pair.server, &zone)?;
    let bin = workspace_root().join("target/release/dnstrace");
    eprintln!(
        "xtask: dnsmasq serves *.test at {}; dnstrace watches {} beside it\n",
        Pair::SERVER4,
        Pair::SERVER_IF
    );
    let trace = Proc(
        pair.server
            .cmd(bin.to_str().context("non UTF-8 path")?)
            .args(["--iface", Pair::SERVER_IF])
            .stdin(Stdio::null())
            .spawn()
            .context("starting dnstrace")?,
    );
    sleep(Duration::from_secs(2));
    for q in QUESTIONS {
        dnstrace_tests::run(
            pair.client
                .cmd("dig")
                .args(["+tries=1", "+time=2", &format!("@{}", Pair::SERVER4)])
                .args(q.split_whitespace()),
        )?;
        sleep(Duration::from_millis(300));
    }
    let garbage = vec![
        b"this is not DNS at all".to_vec(),
        query_bytes(7, "www.test", 1)[..14].to_vec(),
    ];
    udp_exchange(
        &pair.client,
        &format!("{}:53", Pair::SERVER4),
        garbage,
        Duration::from_millis(200),
    )?;
    sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(trace.0.id() as i32, libc::SIGINT) };
    let mut trace = trace;
    trace.0.wait()?;
    drop(pair);
    let left = Command::new("ip").args(["netns", "list"]).output()?;
    eprintln!(
        "\nxtask: demo done; namespaces left: {}",
        String::from_utf8_lossy(&left.stdout).lines().count()
    );
    Ok(())
}
