//! The live view in a real terminal: tmux runs dnstrace on the lab with
//! `bridge-nf-off` on, the test presses keys like an SRE would, and reads
//! the screen tmux captured.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use dnstrace_tests::*;

/// tmux's session, one per lab.
struct Tmux(String);

impl Tmux {
    /// Starts `command` in a detached 200x50 session; the shell stays for
    /// a while after it so the screen it leaves can be read.
    fn start(command: &str) -> Self {
        let session = lab_ns("live-view");
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &session])
            .output();
        let script = format!("{command}; echo dnstrace-exited=$?; sleep 120");
        let ok = Command::new("tmux")
            .args(["new-session", "-d", "-s", &session, "-x", "200", "-y", "50"])
            .arg(script)
            .status()
            .expect("running tmux");
        assert!(ok.success(), "tmux new-session");
        Self(session)
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-J", "-t", &self.0])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        for k in keys {
            let ok = Command::new("tmux")
                .args(["send-keys", "-t", &self.0, k])
                .status()
                .expect("tmux send-keys");
            assert!(ok.success());
            // One frame, so each key acts on what the last one showed.
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Waits until the screen shows every one of `needles`.
    fn wait_for(&self, needles: &[&str], within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let screen = self.screen();
            if needles.iter().all(|n| screen.contains(n)) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "the screen never showed {needles:?}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

#[test]
fn the_live_view_shows_the_anomaly_and_the_dropped_journey() {
    require_root();
    let lab = Lab::up(&["--fault", "bridge-nf-off"]);
    let log = std::env::temp_dir().join(format!("dnstrace-live-test-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let tmux = Tmux::start(&format!(
        "{} trace --timeout 2s {} --pod web --log-file {} {}",
        dnstrace_bin().display(),
        lab_scope().join(" "),
        log.display(),
        EVERY_LOOKUP.join(" ")
    ));
    // The static check is up before any traffic.
    tmux.wait_for(
        &[
            "pod default/web-7d9f8c6b5-x2x4k",
            "bridge_nf_call_iptables_off",
            "waiting for DNS lookups",
        ],
        Duration::from_secs(30),
    );
    lab.dig(
        &WEB,
        &format!("@{SERVICE} kubernetes.default.svc.cluster.local."),
    );
    let screen = tmux.wait_for(
        &["reply_from_unexpected_source", "dropped"],
        Duration::from_secs(20),
    );
    assert!(
        screen.contains("kubernetes.default.svc.cluster.local."),
        "{screen}"
    );
    assert!(screen.contains("failed 1"), "{screen}");

    // The anomaly's fix, and the list narrowed to its lookups.
    let on_anomaly: Vec<&str> = std::iter::once("Tab")
        .chain(
            screen
                .lines()
                .skip_while(|l| !l.starts_with("anomalies"))
                .skip(1)
                .take_while(|l| !l.contains("reply_from_unexpected_source"))
                .map(|_| "Down"),
        )
        .chain(["Enter"])
        .collect();
    tmux.keys(&on_anomaly);
    let screen = tmux.wait_for(&["fix ", "cause ", "evidence "], Duration::from_secs(5));
    assert!(screen.contains("lookups (1 of 1 kept)"), "{screen}");

    // The journey: DNAT on the way in, the un-NATed answer dropped.
    tmux.keys(&["Tab", "Enter"]);
    let screen = tmux.wait_for(&["legs (", "DROP"], Duration::from_secs(5));
    assert!(
        screen.contains("DNAT kube-system/kube-dns (10.96.0.10:53)"),
        "{screen}"
    );
    assert!(screen.contains("dropped: NO_SOCKET"), "{screen}");
    assert!(
        screen.contains("⚠ reply_from_unexpected_source"),
        "{screen}"
    );

    // A small terminal: the journey is still there, the help bar fits.
    let resized = Command::new("tmux")
        .args(["resize-window", "-t", &tmux.0, "-x", "80", "-y", "24"])
        .status()
        .expect("tmux resize-window");
    assert!(resized.success());
    let screen = tmux.wait_for(&["legs (", "Esc back"], Duration::from_secs(5));
    assert!(screen.lines().count() <= 24, "{screen}");
    assert!(screen.contains("q quit"), "the whole help bar: {screen}");

    // Help, then back, then quit: the terminal is given back and the
    // anomalies are printed on it.
    tmux.keys(&["?"]);
    tmux.wait_for(
        &["pause the view (capture goes on)"],
        Duration::from_secs(5),
    );
    tmux.keys(&["Escape", "Escape", "q"]);
    let screen = tmux.wait_for(&["dnstrace-exited="], Duration::from_secs(20));
    assert!(screen.contains("dnstrace-exited=0"), "{screen}");
    assert!(
        screen.contains("capturing DNS on port 53"),
        "the normal screen is back: {screen}"
    );
    assert!(screen.contains("2 anomalies:"), "{screen}");
    assert!(screen.contains("detached from"), "{screen}");
    assert!(!screen.contains("waiting for DNS lookups"), "{screen}");
    let _ = std::fs::remove_file(&log);
}
