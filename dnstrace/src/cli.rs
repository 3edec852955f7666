//! Command-line interface.
use clap::{Parser, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "dnstrace",
    version,
    about = "Follow DNS on a Linux or Kubernetes node with eBPF, packet by packet",
    after_help = "Needs root (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON). Stop with Ctrl-C."
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub capture: CaptureArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Follow each DNS query end to end, through DNAT to the server, its
    /// upstream queries and back, and print it as one journey.
    Trace {
        #[command(flatten)]
        capture: CaptureArgs,
        /// A query without an answer is given up after this long.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "5500ms")]
        timeout: std::time::Duration,
        /// Queries followed at once before the oldest are evicted.
        #[arg(long, default_value_t = 65_536)]
        max_open: usize,
    },
    /// A simulated Kubernetes node in network namespaces, with switchable DNS faults.
    Lab {
        #[command(subcommand)]
        command: crate::lab::LabCommand,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct CaptureArgs {
    /// Interface to watch with tc, ingress and egress (repeatable). Without
    /// one, every device of every network namespace and the kernel's drops.
    #[arg(short, long = "iface", value_name = "IF")]
    pub ifaces: Vec<String>,

    /// Port treated as DNS (repeatable; replaces the default 53).
    #[arg(short, long = "port", value_name = "PORT", default_value = "53")]
    pub ports: Vec<u16>,

    /// Output format: one line per DNS message.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,

    /// Network namespace whose conntrack events and statistics to watch: the
    /// node's (default: the one dnstrace runs in), e.g. /run/netns/NAME.
    #[arg(long, value_name = "PATH")]
    pub node_netns: Option<std::path::PathBuf>,

    /// Kernel ring buffer size in MiB (a power of two); larger rides out bursts.
    #[arg(long, value_name = "MIB", default_value_t = 4, value_parser = parse_ring_mib)]
    pub ring_buffer_mib: u32,

    /// How programs are attached to interfaces: TCX links where the kernel
    /// has them (6.6+), else a clsact qdisc over netlink.
    #[arg(long, value_enum, default_value_t = AttachMode::Auto, hide = true)]
    pub tc_attach: AttachMode,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    Auto,
    Tcx,
    Netlink,
}

fn parse_ring_mib(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of MiB"))?;
    if n == 0 || !n.is_power_of_two() || n > 1024 {
        return Err(format!("{n} MiB: use a power of two between 1 and 1024"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_buffer_size_must_be_a_power_of_two() {
        assert_eq!(parse_ring_mib("8"), Ok(8));
        assert!(parse_ring_mib("3").is_err());
        assert!(parse_ring_mib("0").is_err());
        assert!(parse_ring_mib("x").is_err());
    }

    #[test]
    fn ports_repeat_and_lab_is_a_subcommand() {
        assert!(Cli::try_parse_from(["dnstrace", "lab", "up", "--fault", "bridge-nf-off"]).is_ok());
        assert!(Cli::try_parse_from(["dnstrace", "lab", "up", "--fault", "nope"]).is_err());
        let cli = Cli::try_parse_from(["dnstrace", "-i", "eth0", "--port", "53", "--port", "5353"])
            .unwrap();
        assert_eq!(cli.capture.ports, vec![53, 5353]);
    }
}
