//! latency's command line.

use std::path::PathBuf;

use apps::args::{num_list, path_list, ArgIter};
use apps::Path;

/// How the ping gets back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// One port with a loopback plug: a sample is one pass, TX to RX on the same port.
    Loop,
    /// Two ports cabled to each other; the second echoes: a sample is half a round trip.
    Peer,
}

/// Where the software HCA's device loop runs (devarg `device_loop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceLoop {
    /// Inside each burst of the polling lcore: the device never lags the driver.
    Lcore,
    /// On a thread of its own per port: completions come when that thread gets to them.
    Port,
    /// On one thread for every port of the process.
    Process,
}

impl DeviceLoop {
    pub fn name(self) -> &'static str {
        match self {
            DeviceLoop::Lcore => "lcore",
            DeviceLoop::Port => "port",
            DeviceLoop::Process => "process",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Opts {
    pub wire: Wire,
    /// Stream at burst 1 back to back instead of one packet in flight.
    pub stream: bool,
    /// Streaming: most packets in flight (0: as many as the ring takes).
    pub window: u32,
    /// Streaming: nanoseconds from one send to the next, at least (0: back to back).
    pub gap_ns: u64,
    pub device_loop: DeviceLoop,
    /// Devarg `doorbell_ns`: what the software HCA spends on each doorbell or BlueFlame copy.
    pub doorbell_ns: u32,
    /// Devarg `tx_db_avoid`: doorbell avoidance.
    pub db_avoid: bool,
    /// The device threads spin (`busy_poll=1`) instead of backing off when idle.
    pub busy_poll: bool,
    pub paths: Vec<Path>,
    /// Message sizes (payload bytes after the 14-byte Ethernet header).
    pub sizes: Vec<u16>,
    pub iters: u32,
    pub warmup: u32,
    /// Give up on one packet after this long (counted as lost).
    pub timeout_ms: u64,
    pub out: PathBuf,
    pub plots: bool,
    pub quiet: bool,
    pub eal: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Run(Opts),
    Help,
}

pub const USAGE: &str = "\
usage: latency [--short] [--wire loop|peer] [--out DIR] [--paths LIST] [--sizes LIST]
               [--iters N] [--warmup N] [--timeout-ms MS] [--busy-poll 0|1] [--no-plots]
               [--device-loop lcore|port|process] [--doorbell-ns NS] [--db-avoid 0|1]
               [--stream [--window N] [--gap-ns NS]] [--quiet] [--eal ARG]...

Ping-pong with one packet per burst, per TX path and message size, printed in the shape of
ib_write_lat's table; or (--stream) a stream at burst 1 with each packet's TX-to-RX latency.
  --wire loop        (default) one port, wire=loop: a sample is the time from handing the packet
                     to tx_burst until rx_burst returns it on the same port
  --wire peer        two ports cabled together (wire=peer:<other>); the second sends every packet
                     straight back: a sample is half the round trip, as ib_write_lat reports
  --stream           send at burst 1 back to back, each frame carrying its sequence number and
                     TX time, and match every frame on RX: latency per packet while the ring is
                     busy, and packets per second (--wire loop only; default size 64)
  --window N         streaming: at most N packets in flight (default 0: what the ring takes)
  --gap-ns NS        streaming: at least NS ns from one send to the next (default 0)
  --device-loop L    the software HCA's device_loop devarg (default port)
  --doorbell-ns NS   the software HCA's doorbell_ns devarg, 0..100000 (default 0)
  --db-avoid 0|1     the driver's tx_db_avoid devarg (default 0)
  --short            fewer sizes and iterations (a few seconds)
  --busy-poll 0|1    the software HCA's device threads spin when idle (default 1; with
                     --wire peer two spinning device threads share one core: use 0)
  --out DIR          report directory (default target/bench-report)
  --paths LIST       bf-wc,bf-nowc,doorbell (default all)
  --sizes LIST       message sizes, 2..1024 (default 2,4,8,...,1024; short 2,64,256,1024)
  --iters N          samples per size (default 10000, short 1000; streaming 100000, short 20000)
  --warmup N         unrecorded round trips first (default 100, short 20)
  --timeout-ms MS    a packet not back by then is lost (default 100)
  --no-plots         Markdown only
  --quiet            no progress lines
  --eal ARG          pass ARG to EAL (repeatable)
";

pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Mode, String> {
    let mut a = ArgIter::new(args);
    let mut short = false;
    let mut o = Opts {
        wire: Wire::Loop,
        stream: false,
        window: 0,
        gap_ns: 0,
        device_loop: DeviceLoop::Port,
        doorbell_ns: 0,
        db_avoid: false,
        busy_poll: true,
        paths: Path::ALL.to_vec(),
        sizes: Vec::new(),
        iters: 0,
        warmup: u32::MAX,
        timeout_ms: 100,
        out: PathBuf::from("target/bench-report"),
        plots: true,
        quiet: false,
        eal: Vec::new(),
    };
    while let Some(k) = a.next_opt()? {
        match k.as_str() {
            "--help" | "-h" => return Ok(Mode::Help),
            "--short" => {
                a.flag(&k)?;
                short = true;
            }
            "--stream" => {
                a.flag(&k)?;
                o.stream = true;
            }
            "--window" => o.window = num_list(&k, &a.value(&k)?, 0, 1_000_000)?[0],
            "--gap-ns" => o.gap_ns = num_list(&k, &a.value(&k)?, 0, 1_000_000_000)?[0],
            "--doorbell-ns" => o.doorbell_ns = num_list(&k, &a.value(&k)?, 0, 100_000)?[0],
            "--db-avoid" => o.db_avoid = zero_one(&k, &a.value(&k)?)?,
            "--device-loop" => {
                o.device_loop = match a.value(&k)?.as_str() {
                    "lcore" => DeviceLoop::Lcore,
                    "port" => DeviceLoop::Port,
                    "process" => DeviceLoop::Process,
                    v => {
                        return Err(format!(
                            "--device-loop: `{v}` is not lcore, port or process"
                        ))
                    }
                }
            }
            "--no-plots" => {
                a.flag(&k)?;
                o.plots = false;
            }
            "--quiet" => {
                a.flag(&k)?;
                o.quiet = true;
            }
            "--out" => o.out = PathBuf::from(a.value(&k)?),
            "--busy-poll" => o.busy_poll = zero_one(&k, &a.value(&k)?)?,
            "--wire" => {
                o.wire = match a.value(&k)?.as_str() {
                    "loop" => Wire::Loop,
                    "peer" => Wire::Peer,
                    w => return Err(format!("--wire: `{w}` is not loop or peer")),
                }
            }
            "--paths" => o.paths = path_list(&k, &a.value(&k)?)?,
            "--sizes" => o.sizes = num_list(&k, &a.value(&k)?, 2, 1024)?,
            "--iters" => o.iters = num_list(&k, &a.value(&k)?, 1, 10_000_000)?[0],
            "--warmup" => o.warmup = num_list(&k, &a.value(&k)?, 0, 1_000_000)?[0],
            "--timeout-ms" => o.timeout_ms = num_list(&k, &a.value(&k)?, 1, 60_000)?[0],
            "--eal" => o.eal.push(a.value(&k)?),
            _ => return Err(format!("unknown option {k}\n\n{USAGE}")),
        }
    }
    if o.stream && o.wire != Wire::Loop {
        return Err("--stream runs over --wire loop only".into());
    }
    if o.sizes.is_empty() && o.stream {
        o.sizes = vec![64];
    }
    if o.iters == 0 && o.stream {
        o.iters = if short { 20_000 } else { 100_000 };
    }
    if o.sizes.is_empty() {
        o.sizes = if short {
            vec![2, 64, 256, 1024]
        } else {
            (1..=10).map(|i| 1u16 << i).collect()
        };
    }
    if o.iters == 0 {
        o.iters = if short { 1000 } else { 10_000 };
    }
    if o.warmup == u32::MAX {
        o.warmup = if short { 20 } else { 100 };
    }
    Ok(Mode::Run(o))
}

fn zero_one(k: &str, v: &str) -> Result<bool, String> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        v => Err(format!("{k}: `{v}` is not 0 or 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(a: &[&str]) -> Opts {
        match parse(a.iter().map(|s| s.to_string())).unwrap() {
            Mode::Run(o) => o,
            m => panic!("{m:?}"),
        }
    }

    fn err(a: &[&str]) -> String {
        parse(a.iter().map(|s| s.to_string())).unwrap_err()
    }

    #[test]
    fn defaults_are_ib_write_lat_sizes() {
        let o = run(&[]);
        assert_eq!(o.sizes, [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]);
        assert_eq!((o.iters, o.warmup, o.timeout_ms), (10_000, 100, 100));
        assert_eq!(o.paths, Path::ALL);
        assert_eq!(o.out, PathBuf::from("target/bench-report"));
        assert_eq!(o.wire, Wire::Loop);
        assert_eq!(run(&["--wire=peer"]).wire, Wire::Peer);
        assert!(o.busy_poll);
        assert!(!run(&["--busy-poll", "0"]).busy_poll);
        assert!(!o.stream && !o.db_avoid);
        assert_eq!((o.device_loop, o.doorbell_ns), (DeviceLoop::Port, 0));
    }

    #[test]
    fn stream_and_device_settings() {
        let o = run(&["--stream"]);
        assert!(o.stream);
        assert_eq!(
            (o.sizes.as_slice(), o.iters, o.window),
            (&[64][..], 100_000, 0)
        );
        assert_eq!(run(&["--stream", "--short"]).iters, 20_000);
        let o = run(&[
            "--stream",
            "--sizes=128",
            "--window=8",
            "--gap-ns=500",
            "--device-loop=lcore",
            "--doorbell-ns=177",
            "--db-avoid=1",
        ]);
        assert_eq!(
            (o.sizes.as_slice(), o.window, o.gap_ns),
            (&[128][..], 8, 500)
        );
        assert_eq!((o.device_loop, o.doorbell_ns), (DeviceLoop::Lcore, 177));
        assert!(o.db_avoid);
        assert!(err(&["--stream", "--wire=peer"]).contains("loop only"));
        assert!(err(&["--device-loop=thread"]).contains("lcore, port or process"));
        assert!(err(&["--doorbell-ns=100001"]).contains("outside"));
        assert!(err(&["--db-avoid=yes"]).contains("not 0 or 1"));
    }

    #[test]
    fn short_and_explicit() {
        let o = run(&["--short"]);
        assert_eq!(o.sizes, [2, 64, 256, 1024]);
        assert_eq!((o.iters, o.warmup), (1000, 20));
        let o = run(&[
            "--short",
            "--iters=5",
            "--warmup",
            "0",
            "--paths",
            "doorbell",
        ]);
        assert_eq!((o.iters, o.warmup), (5, 0));
        assert_eq!(o.paths, [Path::Doorbell]);
        let o = run(&["--sizes", "2,1024", "--no-plots", "--quiet", "--eal", "-v"]);
        assert_eq!(o.sizes, [2, 1024]);
        assert!(!o.plots && o.quiet);
        assert_eq!(o.eal, ["-v"]);
    }

    #[test]
    fn bad_arguments() {
        assert!(err(&["--sizes", "1"]).contains("outside"));
        assert!(err(&["--sizes", "2048"]).contains("outside"));
        assert!(err(&["--iters", "0"]).contains("outside"));
        assert!(err(&["--paths", "fast"]).contains("unknown TX path"));
        assert!(err(&["--bursts", "1"]).contains("unknown option"));
        assert!(err(&["--iters"]).contains("needs a value"));
        assert!(err(&["--wire", "tap"]).contains("not loop or peer"));
        assert!(err(&["--busy-poll", "2"]).contains("not 0 or 1"));
        assert!(err(&["--short=yes"]).contains("takes no value"));
        assert_eq!(parse(["--help".to_string()]).unwrap(), Mode::Help);
    }
}
