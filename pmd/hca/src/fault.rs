//! Faults the device injects on purpose, so tests can check that a driver recovers: error
//! completions, a receive buffer error, the link going down and up, lost doorbells, lost or
//! repeated send completions. Each is counted in an `inj_*` counter.

use std::fmt;
use std::str::FromStr;

use crate::error::HcaError;

/// The faults to inject; all off (0) by default. Set in [`crate::HcaConfig::faults`] or at run
/// time with [`crate::Hca::set_faults`]. Counts are over the whole adapter.
///
/// The devarg form ([`FromStr`], [`fmt::Display`]) fits in one DPDK devarg value (no `,` or
/// `=`): items separated by `/`, each `name:N`, e.g. `tx_error:1000/db_drop:64/flap:5000+100`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Every Nth send WQE completes in error instead of executing (syndrome LOCAL_QP_OP,
    /// vendor_err [`INJECTED_VENDOR_ERR`]); its SQ goes to error, as after a real one.
    /// Devarg name `tx_error`.
    pub tx_error_every: u32,
    /// Every Nth frame that finds an RX WQE gets a buffer error instead (syndrome LOCAL_PROT,
    /// vendor_err [`INJECTED_VENDOR_ERR`]), as if the WQE's buffer were not registered; its RQ
    /// goes to error, the frame counts as `rx_drops_error`. Devarg name `rx_error`.
    pub rx_error_every: u32,
    /// Every Nth UAR send doorbell is lost: the WQEs it announced wait for the next one.
    /// Devarg name `db_drop`.
    pub doorbell_drop_every: u32,
    /// After every N frames sent, the link goes down (the port drops what it sends and
    /// receives, its receive buffer is emptied, `port_up` is false) ... Devarg `flap:N+M`.
    pub link_flap_every: u32,
    /// ... until M more frames were sent (and dropped); then it comes back up.
    pub link_flap_frames: u32,
    /// Every Nth good send completion is lost (not written): its WQE executed all the same,
    /// and only a later completion tells the driver so. Error completions are never lost.
    /// Devarg name `cqe_drop`.
    pub cqe_drop_every: u32,
    /// Every Nth good send completion written (not lost) is written twice, the second naming
    /// a WQE the driver has already seen complete (if the CQ has room for both). Devarg name
    /// `cqe_dup`.
    pub cqe_dup_every: u32,
}

/// `vendor_err` of an error CQE the device injected (real errors have 0 here).
pub const INJECTED_VENDOR_ERR: u8 = 0xfe;

impl Faults {
    /// No fault at all.
    pub fn none(&self) -> bool {
        *self == Faults::default()
    }
}

impl Faults {
    /// Reads the devarg form strictly: counts are plain decimal digits (no sign, no spaces),
    /// each fault named once, no empty item; the empty string is no fault. The error says what
    /// is wrong, without repeating `s`.
    pub fn parse(s: &str) -> Result<Faults, String> {
        let mut f = Faults::default();
        if s.is_empty() {
            return Ok(f);
        }
        let mut seen: Vec<&str> = Vec::new();
        for item in s.split('/') {
            let (name, value) = item
                .split_once(':')
                .ok_or_else(|| format!("{item:?} has no ':'"))?;
            if seen.contains(&name) {
                return Err(format!("{name:?} is given twice"));
            }
            seen.push(name);
            let num = |v: &str| {
                v.bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| v.parse::<u32>().ok())
                    .flatten()
                    .ok_or_else(|| format!("{v:?} is not a count (decimal digits)"))
            };
            match name {
                "tx_error" => f.tx_error_every = num(value)?,
                "rx_error" => f.rx_error_every = num(value)?,
                "db_drop" => f.doorbell_drop_every = num(value)?,
                "cqe_drop" => f.cqe_drop_every = num(value)?,
                "cqe_dup" => f.cqe_dup_every = num(value)?,
                "flap" => {
                    let (n, m) = value
                        .split_once('+')
                        .ok_or_else(|| format!("flap {value:?} is not N+M"))?;
                    f.link_flap_every = num(n)?;
                    f.link_flap_frames = num(m)?;
                }
                _ => return Err(format!("unknown fault {name:?}")),
            }
        }
        Ok(f)
    }
}

impl FromStr for Faults {
    type Err = HcaError;

    /// [`Faults::parse`], its error naming the text and the form expected.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Faults::parse(s).map_err(|why| {
            HcaError::InvalidArgument(format!(
                "faults {s:?}: {why}; expected items like tx_error:N, rx_error:N, db_drop:N, \
                 flap:N+M, cqe_drop:N, cqe_dup:N separated by '/'"
            ))
        })
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items = Vec::new();
        if self.tx_error_every != 0 {
            items.push(format!("tx_error:{}", self.tx_error_every));
        }
        if self.rx_error_every != 0 {
            items.push(format!("rx_error:{}", self.rx_error_every));
        }
        if self.doorbell_drop_every != 0 {
            items.push(format!("db_drop:{}", self.doorbell_drop_every));
        }
        if self.link_flap_every != 0 {
            items.push(format!(
                "flap:{}+{}",
                self.link_flap_every, self.link_flap_frames
            ));
        }
        if self.cqe_drop_every != 0 {
            items.push(format!("cqe_drop:{}", self.cqe_drop_every));
        }
        if self.cqe_dup_every != 0 {
            items.push(format!("cqe_dup:{}", self.cqe_dup_every));
        }
        f.write_str(&items.join("/"))
    }
}

/// A countdown to the next "every Nth": `tick` is true on the Nth, 2Nth, ... event.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Every {
    n: u32,
    left: u32,
}

impl Every {
    pub(crate) fn new(n: u32) -> Every {
        Every { n, left: n }
    }

    /// Whether some event will hit: while not, events need no counting.
    #[inline]
    pub(crate) fn armed(&self) -> bool {
        self.n != 0
    }

    /// Whether the next event will be the one to hit.
    #[inline]
    pub(crate) fn next_hits(&self) -> bool {
        self.n != 0 && self.left == 1
    }

    /// One more event; whether it is the one to hit.
    #[inline]
    pub(crate) fn tick(&mut self) -> bool {
        if self.n == 0 {
            return false;
        }
        self.left -= 1;
        if self.left == 0 {
            self.left = self.n;
            return true;
        }
        false
    }
}

/// Where the device is in each fault's schedule.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultState {
    pub(crate) cfg: Faults,
    pub(crate) tx_error: Every,
    pub(crate) rx_error: Every,
    pub(crate) doorbell: Every,
    pub(crate) cqe_drop: Every,
    pub(crate) cqe_dup: Every,
    /// Frames until the link goes down (up) or comes back (down).
    pub(crate) flap_left: u64,
    /// The link is down because of a flap.
    pub(crate) flapped: bool,
}

impl FaultState {
    pub(crate) fn new(cfg: Faults) -> FaultState {
        FaultState {
            cfg,
            tx_error: Every::new(cfg.tx_error_every),
            rx_error: Every::new(cfg.rx_error_every),
            doorbell: Every::new(cfg.doorbell_drop_every),
            cqe_drop: Every::new(cfg.cqe_drop_every),
            cqe_dup: Every::new(cfg.cqe_dup_every),
            flap_left: u64::from(cfg.link_flap_every),
            flapped: false,
        }
    }

    /// Whether a fault counts send WQEs or their completions one by one: then a send queue
    /// cannot take a run of WQEs at once.
    #[inline]
    pub(crate) fn per_send_wqe(&self) -> bool {
        self.tx_error.armed() || self.cqe_drop.armed() || self.cqe_dup.armed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devarg_form_round_trips_and_rejects_what_it_cannot_read() {
        let f: Faults = "tx_error:1000/rx_error:7/db_drop:64/flap:5000+100/cqe_drop:9/cqe_dup:11"
            .parse()
            .unwrap();
        assert_eq!(
            f,
            Faults {
                tx_error_every: 1000,
                rx_error_every: 7,
                doorbell_drop_every: 64,
                link_flap_every: 5000,
                link_flap_frames: 100,
                cqe_drop_every: 9,
                cqe_dup_every: 11,
            }
        );
        assert_eq!(f.to_string().parse::<Faults>().unwrap(), f);
        assert!("".parse::<Faults>().unwrap().none());
        for bad in [
            "tx_error",
            "tx_error:x",
            "nope:1",
            "flap:10",
            "db_drop:-1",
            "db_drop:+1",
            "tx_error: 1",
            "tx_error:",
            "tx_error:1/",
            "tx_error:1//rx_error:2",
            "tx_error:1/tx_error:2",
            "flap:1+",
            "rx_error:99999999999",
            "cqe_drop",
            "cqe_drop:",
            "cqe_drop:-3",
            "cqe_drop:0x10",
            "cqe_drop:4294967296",
            "cqe_drop:3/cqe_drop:3",
            "cqe_dup:1+1",
            "cqe_drops:3",
        ] {
            let e = bad.parse::<Faults>().unwrap_err().to_string();
            assert!(e.contains("expected items"), "{bad}: {e}");
        }
    }

    #[test]
    fn every_nth_hits_on_the_nth() {
        let mut e = Every::new(3);
        let hits: Vec<bool> = (0..7).map(|_| e.tick()).collect();
        assert_eq!(hits, [false, false, true, false, false, true, false]);
        assert!(!Every::new(0).tick());
    }
}
