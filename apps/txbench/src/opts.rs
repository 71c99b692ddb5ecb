//! txbench's command line.

use std::path::PathBuf;

use apps::args::{num_list, path_list, ArgIter};
use apps::Path;
use mlx4rs::mmio::Copy64;

/// The driver's default inline threshold (devargs `txq_inline`): the main grid runs at it.
pub const DEFAULT_INLINE: u16 = 104;

#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    pub paths: Vec<Path>,
    pub bursts: Vec<u16>,
    pub sizes: Vec<u16>,
    /// Inline thresholds swept at burst `inline_burst` over every size and path.
    pub inlines: Vec<u16>,
    pub inline_burst: u16,
    /// Length of one driver's turn in a round.
    pub slice_ms: u64,
    /// Rounds per point; each round gives every driver one turn, in alternation.
    pub rounds: u32,
    pub out: PathBuf,
    pub plots: bool,
    pub quiet: bool,
    /// The software HCA's device threads spin instead of backing off when idle.
    pub busy_poll: bool,
    /// Extra EAL arguments (before the generated `--vdev`s).
    pub eal: Vec<String>,
    /// The BlueFlame copy routine the ports use (None: the best this CPU offers).
    pub copy: Option<Copy64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Callgrind {
    pub path: Path,
    pub packets: u64,
    pub size: u16,
    pub burst: u16,
    pub inline: u16,
    /// Fill the ring with the device stopped, then measure `packets` calls that send nothing.
    pub full_ring: bool,
    /// Real `rte_mbuf`s through EAL and `rte_eth_fp_ops`, the device on its own thread.
    pub mbufs: bool,
    /// Count `rx_burst` (frames looped back) instead of `tx_burst`.
    pub rx: bool,
    /// Doorbell avoidance on (`DbAvoid`, its deadline out of reach), in the step-mode counts.
    pub avoid: bool,
    pub copy: Option<Copy64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Sweep(Sweep),
    Callgrind(Callgrind),
    /// Doorbell avoidance off and on, this many packets per point (`db_avoid`).
    DbAvoid(u64),
    Help,
}

pub const USAGE: &str = "\
usage: txbench [--short] [--out DIR] [--paths LIST] [--bursts LIST] [--sizes LIST]
               [--inlines LIST] [--inline-burst N] [--slice-ms MS] [--rounds N]
               [--busy-poll 0|1] [--copy C] [--no-plots] [--quiet] [--eal ARG]...
       txbench --callgrind [--path P] [--packets N] [--size B] [--burst N] [--inline B]
                           [--full-ring | --mbufs | --rx] [--avoid] [--copy C]
       txbench --db-avoid [PACKETS]

Sweep (needs EAL; runs net_mlx4rs ports on the software HCA next to net_null and net_ring):
  --short            about a quarter of the points and shorter turns (about 15 s)
  --out DIR          report directory (default target/bench-report)
  --paths LIST       bf-wc,bf-nowc,doorbell (default all)
  --bursts LIST      burst sizes, 1..64 (default 1,8,32,64)
  --sizes LIST       packet sizes, 60..1500 (default 64,108,128,256,512,1024,1500)
  --inlines LIST     txq_inline values also swept at --inline-burst (default 0,104,928)
  --inline-burst N   burst of the inline sweep (default 32)
  --slice-ms MS      one driver's turn per round (default 100, short 20)
  --rounds N         alternating rounds per point (default 5, short 3)
  --busy-poll 0|1    the software HCA's device thread spins when idle (default 0, as the
                     driver's default; 1 lets it see more BlueFlame copies before the next
                     one overwrites the half)
  --copy C           BlueFlame copy routine: movdir64b, avx512, qwords or best (default:
                     best, the first of those this CPU offers); the report names it
  --no-plots         Markdown only
  --quiet            no progress lines
  --eal ARG          pass ARG to EAL (repeatable), e.g. --eal=--log-level=pmd.net.mlx4rs:debug

Instruction counts (no EAL: the TX queue against the software HCA stepped in this thread):
  --callgrind        push --packets packets through tx_burst, then print the counters; run it
                     under valgrind --tool=callgrind --toggle-collect='*measured_burst*'
  --path P           bf-wc, bf-nowc or doorbell (default bf-wc)
  --packets N        default 100000
  --size B           default 64
  --burst N          default 32
  --inline B         default 104
  --avoid            doorbell avoidance on (the step-mode counts only): the device keeps up,
                     so nothing is skipped, and the count is what avoidance costs a call
  --full-ring        fill the ring while the device is held, then make --packets calls that
                     send nothing (collect `measured_full_ring`: instructions per call)
  --mbufs            real rte_mbufs: EAL, a net_mlx4rs port, tx_pkt_burst through
                     rte_eth_fp_ops, the device on its own thread; run under valgrind
                     --fair-sched=yes and collect `measured_eal_burst`; every call finds the
                     device drained and sends its whole burst
  --rx               count rx_burst instead (collect `measured_rx_burst`): a TX queue sends
                     each burst, the looped wire brings it back; the refill is included
  --copy C           as for the sweep (valgrind runs only the qwords routine)

Doorbell avoidance (no EAL, the software HCA stepped in this thread):
  --db-avoid [N]     doorbells, completions and modeled Mpps per packet, avoidance off and
                     on, bursts 1, 2, 4, 8, the device running once every 1, 4 or 16 calls;
                     N packets per point (default 100000); must be the only option
";

pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Mode, String> {
    let args: Vec<String> = args.into_iter().collect();
    if args.first().is_some_and(|a| a == "--db-avoid") {
        return match &args[1..] {
            [] => Ok(Mode::DbAvoid(100_000)),
            [n] => match n.parse::<u64>() {
                Ok(n) if n > 0 => Ok(Mode::DbAvoid(n)),
                _ => Err(format!(
                    "--db-avoid takes a packet count above 0, not {n:?}"
                )),
            },
            _ => Err("--db-avoid takes only a packet count".into()),
        };
    }
    let mut a = ArgIter::new(args);
    let mut short = false;
    let mut callgrind = false;
    let mut s = Sweep {
        paths: Path::ALL.to_vec(),
        bursts: vec![1, 8, 32, 64],
        sizes: vec![64, 108, 128, 256, 512, 1024, 1500],
        inlines: vec![0, DEFAULT_INLINE, 928],
        inline_burst: 32,
        slice_ms: 0,
        rounds: 0,
        out: PathBuf::from("target/bench-report"),
        plots: true,
        quiet: false,
        busy_poll: false,
        eal: Vec::new(),
        copy: None,
    };
    let mut c = Callgrind {
        path: Path::BfWc,
        packets: 100_000,
        size: 64,
        burst: 32,
        inline: DEFAULT_INLINE,
        full_ring: false,
        mbufs: false,
        rx: false,
        avoid: false,
        copy: None,
    };
    let (mut sizes_set, mut bursts_set, mut inlines_set) = (false, false, false);
    let mut sweep_opt = None;
    let mut cg_opt = None;
    while let Some(k) = a.next_opt()? {
        match k.as_str() {
            "--help" | "-h" => return Ok(Mode::Help),
            "--short" => {
                a.flag(&k)?;
                short = true;
            }
            "--callgrind" => {
                a.flag(&k)?;
                callgrind = true;
            }
            "--no-plots" => {
                a.flag(&k)?;
                s.plots = false;
            }
            "--quiet" => {
                a.flag(&k)?;
                s.quiet = true;
            }
            "--out" => s.out = PathBuf::from(a.value(&k)?),
            "--paths" => s.paths = path_list(&k, &a.value(&k)?)?,
            "--bursts" => {
                s.bursts = num_list(&k, &a.value(&k)?, 1, 64)?;
                bursts_set = true;
            }
            "--sizes" => {
                s.sizes = num_list(&k, &a.value(&k)?, 60, 1500)?;
                sizes_set = true;
            }
            "--inlines" => {
                s.inlines = inline_list(&k, &a.value(&k)?)?;
                inlines_set = true;
            }
            "--inline-burst" => s.inline_burst = num_list(&k, &a.value(&k)?, 1, 64)?[0],
            "--slice-ms" => s.slice_ms = num_list(&k, &a.value(&k)?, 1, 10_000)?[0],
            "--rounds" => s.rounds = num_list(&k, &a.value(&k)?, 1, 100)?[0],
            "--eal" => s.eal.push(a.value(&k)?),
            "--busy-poll" => {
                s.busy_poll = match a.value(&k)?.as_str() {
                    "0" => false,
                    "1" => true,
                    v => return Err(format!("--busy-poll: `{v}` is not 0 or 1")),
                }
            }
            "--path" => c.path = Path::parse(&a.value(&k)?)?,
            "--packets" => c.packets = num_list(&k, &a.value(&k)?, 1, 1 << 40)?[0],
            "--size" => c.size = num_list(&k, &a.value(&k)?, 14, 1500)?[0],
            "--burst" => c.burst = num_list(&k, &a.value(&k)?, 1, 64)?[0],
            "--inline" => c.inline = inline_list(&k, &a.value(&k)?)?[0],
            "--full-ring" => {
                a.flag(&k)?;
                c.full_ring = true;
            }
            "--mbufs" => {
                a.flag(&k)?;
                c.mbufs = true;
            }
            "--rx" => {
                a.flag(&k)?;
                c.rx = true;
            }
            "--avoid" => {
                a.flag(&k)?;
                c.avoid = true;
            }
            "--copy" => {
                let v = a.value(&k)?;
                let copy = match v.as_str() {
                    "best" => None,
                    name => Some(Copy64::parse(name)?),
                };
                (s.copy, c.copy) = (copy, copy);
            }
            _ => return Err(format!("unknown option {k}\n\n{USAGE}")),
        }
        let sweep_only = !matches!(
            k.as_str(),
            "--path"
                | "--packets"
                | "--size"
                | "--burst"
                | "--inline"
                | "--full-ring"
                | "--mbufs"
                | "--rx"
                | "--avoid"
                | "--copy"
                | "--callgrind"
        );
        // --copy belongs to both modes.
        if k == "--copy" {
            continue;
        }
        if sweep_only {
            sweep_opt.get_or_insert(k.clone());
        } else if k != "--callgrind" {
            cg_opt.get_or_insert(k.clone());
        }
    }
    if callgrind {
        if let Some(k) = sweep_opt {
            return Err(format!("{k} is a sweep option; --callgrind takes --path, --packets, --size, --burst, --inline, --full-ring, --mbufs, --rx, --avoid, --copy"));
        }
        if u8::from(c.full_ring) + u8::from(c.mbufs) + u8::from(c.rx) > 1 {
            return Err("--full-ring, --mbufs and --rx are different measurements".into());
        }
        if c.avoid && (c.mbufs || c.rx) {
            return Err("--avoid is for the step-mode tx_burst counts".into());
        }
        return Ok(Mode::Callgrind(c));
    }
    if let Some(k) = cg_opt {
        return Err(format!("{k} needs --callgrind"));
    }
    if short {
        if !bursts_set {
            s.bursts = vec![1, 32];
        }
        if !sizes_set {
            s.sizes = vec![64, 512, 1500];
        }
        if !inlines_set {
            s.inlines = vec![0, DEFAULT_INLINE, 928];
        }
    }
    if s.slice_ms == 0 {
        s.slice_ms = if short { 20 } else { 100 };
    }
    if s.rounds == 0 {
        s.rounds = if short { 3 } else { 5 };
    }
    Ok(Mode::Sweep(s))
}

/// `txq_inline` values the driver accepts: 0 or 17..=928.
fn inline_list(key: &str, s: &str) -> Result<Vec<u16>, String> {
    let v = num_list(key, s, 0u16, 928)?;
    if let Some(bad) = v.iter().find(|&&i| i != 0 && i < 17) {
        return Err(format!("{key}: {bad} is not 0 or 17..=928 (txq_inline)"));
    }
    Ok(v)
}

/// One measured point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Point {
    pub inline: u16,
    pub path: Path,
    pub burst: u16,
    pub size: u16,
}

impl Sweep {
    /// Every path x burst x size at the default threshold, then every path x size x threshold
    /// at `inline_burst`; no point twice.
    pub fn points(&self) -> Vec<Point> {
        let mut v = Vec::new();
        for &path in &self.paths {
            for &burst in &self.bursts {
                for &size in &self.sizes {
                    v.push(Point {
                        inline: DEFAULT_INLINE,
                        path,
                        burst,
                        size,
                    });
                }
            }
        }
        for &inline in &self.inlines {
            for &path in &self.paths {
                for &size in &self.sizes {
                    let p = Point {
                        inline,
                        path,
                        burst: self.inline_burst,
                        size,
                    };
                    if !v.contains(&p) {
                        v.push(p);
                    }
                }
            }
        }
        v
    }

    /// The thresholds that need a port of their own.
    pub fn port_inlines(&self) -> Vec<u16> {
        let mut v = vec![DEFAULT_INLINE];
        for &i in &self.inlines {
            if !v.contains(&i) {
                v.push(i);
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: &[&str]) -> Result<Mode, String> {
        parse(a.iter().map(|s| s.to_string()))
    }

    fn sweep(a: &[&str]) -> Sweep {
        match p(a).unwrap() {
            Mode::Sweep(s) => s,
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn db_avoid_takes_only_a_packet_count() {
        assert_eq!(p(&["--db-avoid"]).unwrap(), Mode::DbAvoid(100_000));
        assert_eq!(p(&["--db-avoid", "500"]).unwrap(), Mode::DbAvoid(500));
        assert!(p(&["--db-avoid", "0"]).is_err());
        assert!(p(&["--db-avoid", "5", "--short"]).is_err());
    }

    #[test]
    fn defaults_cover_the_issue_grid() {
        let s = sweep(&[]);
        assert_eq!(s.bursts, [1, 8, 32, 64]);
        assert_eq!(s.sizes, [64, 108, 128, 256, 512, 1024, 1500]);
        assert_eq!(s.paths, Path::ALL);
        assert_eq!((s.slice_ms, s.rounds), (100, 5));
        // 3 paths x 4 bursts x 7 sizes, plus thresholds 0 and 928 at burst 32.
        assert_eq!(s.points().len(), 84 + 2 * 3 * 7);
        assert_eq!(s.port_inlines(), [104, 0, 928]);
    }

    #[test]
    fn short_mode_is_small() {
        let s = sweep(&["--short"]);
        assert_eq!(s.bursts, [1, 32]);
        assert_eq!(s.sizes, [64, 512, 1500]);
        assert_eq!((s.slice_ms, s.rounds), (20, 3));
        assert_eq!(s.points().len(), 18 + 18);
        let s = sweep(&["--short", "--sizes", "128", "--rounds=1"]);
        assert_eq!((s.sizes.as_slice(), s.rounds), (&[128u16][..], 1));
    }

    #[test]
    fn explicit_lists_and_eal() {
        let s = sweep(&[
            "--paths=doorbell",
            "--bursts",
            "8",
            "--inlines",
            "0",
            "--out",
            "/x",
            "--eal",
            "--log-level=8",
            "--no-plots",
        ]);
        assert_eq!(s.paths, [Path::Doorbell]);
        assert_eq!(s.inlines, [0]);
        assert_eq!(s.out, PathBuf::from("/x"));
        assert_eq!(s.eal, ["--log-level=8"]);
        assert!(!s.plots);
        assert!(!s.busy_poll);
        assert!(sweep(&["--busy-poll=1"]).busy_poll);
        assert!(p(&["--busy-poll", "yes"])
            .unwrap_err()
            .contains("not 0 or 1"));
        assert_eq!(s.port_inlines(), [104, 0]);
    }

    #[test]
    fn callgrind_mode() {
        let m = p(&[
            "--callgrind",
            "--path",
            "doorbell",
            "--packets=1000",
            "--inline",
            "0",
        ]);
        assert_eq!(
            m.unwrap(),
            Mode::Callgrind(Callgrind {
                path: Path::Doorbell,
                packets: 1000,
                size: 64,
                burst: 32,
                inline: 0,
                full_ring: false,
                mbufs: false,
                rx: false,
                avoid: false,
                copy: None,
            })
        );
        assert!(p(&["--callgrind", "--short"])
            .unwrap_err()
            .contains("sweep option"));
        match p(&["--callgrind", "--full-ring"]).unwrap() {
            Mode::Callgrind(c) => assert!(c.full_ring),
            m => panic!("{m:?}"),
        }
        assert!(p(&["--full-ring"])
            .unwrap_err()
            .contains("needs --callgrind"));
        assert!(p(&["--packets", "5"])
            .unwrap_err()
            .contains("needs --callgrind"));
    }

    #[test]
    fn bad_arguments() {
        assert!(p(&["--bursts", "0"]).unwrap_err().contains("outside"));
        assert!(p(&["--bursts", "65"]).is_err());
        assert!(p(&["--sizes", "big"]).unwrap_err().contains("not a number"));
        assert!(p(&["--inlines", "5"]).unwrap_err().contains("txq_inline"));
        assert!(p(&["--paths", "bf"]).is_err());
        assert!(p(&["--frobnicate"]).unwrap_err().contains("unknown option"));
        assert!(p(&["--out"]).unwrap_err().contains("needs a value"));
        assert!(p(&["extra"]).is_err());
        assert_eq!(p(&["--help"]).unwrap(), Mode::Help);
    }
}
