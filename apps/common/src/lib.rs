//! Shared pieces of the benchmark applications (`txbench`, `latency`): EAL and port set-up,
//! fast-path calls through ethdev's function table, order statistics, the bus cost model,
//! reports with plots, progress lines and clean interruption.
//!
//! Only [`eal`] talks to C; everything else is plain Rust that unit tests cover.

pub mod args;
#[allow(unsafe_code)]
pub mod eal;
pub mod model;
pub mod progress;
pub mod report;
pub mod stats;

/// The TX paths a `net_mlx4rs` port can run, as the benchmarks name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Path {
    /// BlueFlame on a write-combining page (`wc=on`).
    BfWc,
    /// BlueFlame forced on a page without write combining (`wc=off,bf=on`).
    BfNoWc,
    /// One doorbell per burst (`wc=off`: the capability check turns BlueFlame off).
    Doorbell,
}

impl Path {
    pub const ALL: [Path; 3] = [Path::BfWc, Path::BfNoWc, Path::Doorbell];

    /// The name used on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Path::BfWc => "bf-wc",
            Path::BfNoWc => "bf-nowc",
            Path::Doorbell => "doorbell",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Path::BfWc => "BlueFlame with WC",
            Path::BfNoWc => "BlueFlame without WC",
            Path::Doorbell => "doorbell",
        }
    }

    /// The devargs that make this path live on a port.
    pub fn devargs(self) -> &'static str {
        match self {
            Path::BfWc => "wc=on,bf=auto",
            Path::BfNoWc => "wc=off,bf=on",
            Path::Doorbell => "wc=off,bf=auto",
        }
    }

    pub fn parse(s: &str) -> Result<Path, String> {
        Path::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown TX path `{s}` (expected bf-wc, bf-nowc or doorbell)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_names_round_trip() {
        for p in Path::ALL {
            assert_eq!(Path::parse(p.name()), Ok(p));
        }
        assert!(Path::parse("bf").unwrap_err().contains("bf-wc"));
    }
}
