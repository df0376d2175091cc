//! Link shaping with `tc`: an HTB class, the probe for netem, and the qdisc counters.
//!
//! The HTB class has rate = ceil and an explicit burst, over a pfifo leaf (or a netem delay where
//! the kernel has netem).

use super::state::{Created, LabState};
use crate::error::{ExecError, Result};
use crate::tool;
use serde::Serialize;

/// Packets the leaf queue holds: a few hundred microseconds of line rate in GSO-sized
/// packets, enough for TCP to fill the link without the queue adding tens of milliseconds.
pub const QUEUE_PACKETS: u32 = 128;

/// The smallest burst: two full Ethernet frames, so that one frame never waits for tokens it
/// can never accumulate.
pub const MIN_BURST_BYTES: u64 = 2 * 1514;

/// The largest burst a user may ask for.
pub const MAX_BURST_BYTES: u64 = 64 << 20;

/// How long the default burst lets a sender run at the veth's (unbounded) speed, in µs.
/// HTB's own default (rate / HZ plus a frame) is about 64 KB at 1 Gb/s, which lets messages
/// below that size through far faster than the rate; 50 µs of the rate keeps that error
/// small while leaving the kernel's timer slack room to sustain the rate.
pub const DEFAULT_BURST_US: f64 = 50.0;

/// The default burst for a rate: [`DEFAULT_BURST_US`] worth of it, at least [`MIN_BURST_BYTES`].
pub fn default_burst(gbps: f64) -> u64 {
    let bytes = gbps * 1e9 / 8.0 * DEFAULT_BURST_US * 1e-6;
    (bytes.ceil() as u64).max(MIN_BURST_BYTES)
}

/// HTB's quantum: how much a class sends per round. The lab has one class per link, so it
/// only has to be legal (at most 200000) and large enough not to be warned about.
const QUANTUM_BYTES: u64 = 60_000;

/// Whether this kernel has the netem qdisc, probed on the loopback of namespace `ns` (a probe
/// that leaves nothing behind: the qdisc is removed at once).
pub fn netem_available(ns: &str) -> Result<bool> {
    let add = [
        "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us",
    ];
    let (status, _, stderr) = tool::output("tc", &add)?;
    if status.success() {
        tool::run("tc", &["-n", ns, "qdisc", "del", "dev", "lo", "root"])?;
        return Ok(true);
    }
    if stderr.contains("Specified qdisc kind is unknown") {
        return Ok(false);
    }
    Err(ExecError::Tool {
        command: tool::command_line("tc", &add),
        message: tool::first_line_or(&stderr, "failed").to_string(),
    })
}

/// Shapes the egress of `dev` (inside `namespace` when given) to the lab's rate and burst,
/// adding the lab's delay when `delay` is set.
pub fn shape(state: &mut LabState, namespace: Option<&str>, dev: &str, delay: bool) -> Result<()> {
    let tc = |args: &[&str]| -> Result<String> {
        let mut all: Vec<&str> = Vec::new();
        if let Some(ns) = namespace {
            all.extend(["-n", ns]);
        }
        all.extend(args);
        tool::run("tc", &all)
    };
    tc(&[
        "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1",
    ])?;
    state.record(Created::Qdisc {
        namespace: namespace.map(str::to_string),
        dev: dev.to_string(),
    })?;
    let rate = format!("{}bit", rate_bits(state.gbps));
    let burst = state.burst_bytes.to_string();
    let quantum = QUANTUM_BYTES.to_string();
    tc(&[
        "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", &rate, "ceil",
        &rate, "burst", &burst, "cburst", &burst, "quantum", &quantum,
    ])?;
    let limit = QUEUE_PACKETS.to_string();
    if delay {
        let delay = format!("{}us", state.latency_us);
        tc(&[
            "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem", "delay", &delay,
            "limit", &limit,
        ])?;
    } else {
        tc(&[
            "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "pfifo", "limit", &limit,
        ])?;
    }
    Ok(())
}

/// The rate in bits per second, as tc takes it.
pub fn rate_bits(gbps: f64) -> u64 {
    (gbps * 1e9).round() as u64
}

/// What a link's shaper has passed and refused since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Bytes the root qdisc has sent.
    pub bytes: u64,
    /// Packets the root qdisc has sent.
    pub packets: u64,
    /// Packets the qdisc dropped.
    pub drops: u64,
    /// Times the shaper found its rate exceeded (tc's `overlimits`).
    pub overlimits: u64,
}

/// The counters of the HTB root qdisc of `dev` (inside `namespace` when given).
pub fn counters(namespace: Option<&str>, dev: &str) -> Result<Counters> {
    let mut args: Vec<&str> = Vec::new();
    if let Some(ns) = namespace {
        args.extend(["-n", ns]);
    }
    args.extend(["-s", "-j", "qdisc", "show", "dev", dev]);
    let text = tool::run("tc", &args)?;
    parse_counters(&text).ok_or_else(|| ExecError::Tool {
        command: tool::command_line("tc", &args),
        message: format!(
            "no HTB root qdisc with counters in its output: {}",
            text.trim()
        ),
    })
}

fn parse_counters(json: &str) -> Option<Counters> {
    let qdiscs: serde_json::Value = serde_json::from_str(json).ok()?;
    let root = qdiscs
        .as_array()?
        .iter()
        .find(|q| q["kind"] == "htb" && q["root"] == true)?;
    let field = |name: &str| root[name].as_u64();
    Some(Counters {
        bytes: field("bytes")?,
        packets: field("packets")?,
        drops: field("drops")?,
        overlimits: field("overlimits")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_burst_is_fifty_microseconds_of_the_rate() {
        assert_eq!(default_burst(1.0), 6250);
        assert_eq!(default_burst(10.0), 62500);
        assert_eq!(default_burst(0.001), MIN_BURST_BYTES);
        assert_eq!(rate_bits(0.2), 200_000_000);
    }

    #[test]
    fn counters_come_from_the_htb_root() {
        let json = r#"[{"kind":"htb","handle":"1:","root":true,"bytes":1500,"packets":3,"drops":1,"overlimits":7,"requeues":0},
                       {"kind":"pfifo","handle":"10:","parent":"1:1","bytes":9,"packets":9,"drops":0,"overlimits":0}]"#;
        assert_eq!(
            parse_counters(json),
            Some(Counters {
                bytes: 1500,
                packets: 3,
                drops: 1,
                overlimits: 7
            })
        );
        assert_eq!(parse_counters(r#"[{"kind":"noqueue","root":true}]"#), None);
    }
}
