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

#[derive(Debug, Clone, PartialEq)]
pub struct Opts {
    pub wire: Wire,
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
               [--quiet] [--eal ARG]...

Ping-pong with one packet per burst, per TX path and message size, printed in the shape of
ib_write_lat's table.
  --wire loop        (default) one port, wire=loop: a sample is the time from handing the packet
                     to tx_burst until rx_burst returns it on the same port
  --wire peer        two ports cabled together (wire=peer:<other>); the second sends every packet
                     straight back: a sample is half the round trip, as ib_write_lat reports
  --short            fewer sizes and iterations (a few seconds)
  --busy-poll 0|1    the software HCA's device threads spin when idle (default 1; with
                     --wire peer two spinning device threads share one core: use 0)
  --out DIR          report directory (default target/bench-report)
  --paths LIST       bf-wc,bf-nowc,doorbell (default all)
  --sizes LIST       message sizes, 2..1024 (default 2,4,8,...,1024; short 2,64,256,1024)
  --iters N          samples per size (default 10000, short 1000)
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
            "--no-plots" => {
                a.flag(&k)?;
                o.plots = false;
            }
            "--quiet" => {
                a.flag(&k)?;
                o.quiet = true;
            }
            "--out" => o.out = PathBuf::from(a.value(&k)?),
            "--busy-poll" => {
                o.busy_poll = match a.value(&k)?.as_str() {
                    "0" => false,
                    "1" => true,
                    v => return Err(format!("--busy-poll: `{v}` is not 0 or 1")),
                }
            }
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
