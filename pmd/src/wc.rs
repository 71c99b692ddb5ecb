//! The capability check that decides, once per port at device init, whether the BlueFlame
//! path is live: the device must report a BF register, the CPU must be able to map it
//! write-combining (PAT on x86), and a functional self-test must show that the device really
//! executed a WQE that arrived as a BF copy (the approach of mlx5's `mlx5_core_test_wc`).
//!
//! On a card a BF copy through an uncached mapping may still execute, only slower (the seed
//! thread measured 1.47 us per message against 1.00 us for the doorbell): the eight 64-bit
//! stores of a copy each become a bus transaction. So once the copy is known to execute, the
//! check also times the store sequence into the BF page against the doorbell's
//! ([`time_stores`]): through write combining a 64-byte copy costs about what the 4-byte
//! doorbell store does; uncached it costs several times that, and hundreds of nanoseconds more.

use std::time::{Duration, Instant};

use mlx4_prm::{opcode, srcrb, CtrlSeg};

use crate::devargs::BfMode;
use crate::hw::Device;
use crate::mmio::{cpu_has_pat, BfReg, Copy64, SendDoorbell, Txbb};
use crate::ring::{CqRing, SqRing};
use crate::txq::TxPath;

/// The decision and why, logged once and exported in xstats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathChoice {
    pub path: TxPath,
    pub reason: String,
    /// The operator forced a path the checks advise against.
    pub warning: bool,
}

/// What the self-test saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelfTest {
    /// The device executed the BF copy (which asked for a completion the ring copy did not).
    CopyExecuted,
    /// The device ignored the BF copy and fetched the WQE from the ring.
    CopyIgnored,
}

/// Decides the TX path of a port on `dev`; the self-test's queues live on NUMA node `socket`.
pub fn decide(dev: &dyn Device, mode: BfMode, socket: i32, copy: Copy64) -> PathChoice {
    let choice = |path, reason: &str, warning| PathChoice {
        path,
        reason: reason.to_owned(),
        warning,
    };
    if mode == BfMode::Off {
        return choice(TxPath::Doorbell, "bf=off", false);
    }
    if dev.caps().bf_reg_size == 0 {
        return choice(
            TxPath::Doorbell,
            "the device reports no BlueFlame register (bf_reg_size 0)",
            mode == BfMode::On,
        );
    }
    if !cpu_has_pat() {
        return match mode {
            BfMode::On => choice(
                TxPath::BlueFlame,
                "bf=on although the CPU has no PAT to map the BF page write-combining",
                true,
            ),
            _ => choice(
                TxPath::Doorbell,
                "the CPU has no PAT, so the BF page cannot be write-combining",
                false,
            ),
        };
    }
    match self_test(dev, socket, copy) {
        Ok(SelfTest::CopyExecuted) => match time_stores(dev, socket, copy) {
            Ok(t) if t.uncached() && mode == BfMode::On => choice(
                TxPath::BlueFlame,
                &format!("bf=on although {t}: the BF page looks uncached"),
                true,
            ),
            Ok(t) if t.uncached() => choice(
                TxPath::Doorbell,
                &format!(
                    "self-test: the device executed a BF copy, but {t}: the BF page is mapped \
                     uncached (no write combining)"
                ),
                false,
            ),
            Ok(t) => choice(
                TxPath::BlueFlame,
                &format!("self-test: the device executed a BF copy, and {t} (write combining)"),
                false,
            ),
            Err(e) => choice(
                TxPath::BlueFlame,
                &format!(
                    "self-test: the device executed a BF copy (write combining works); the store \
                     timing failed: {e}"
                ),
                false,
            ),
        },
        Ok(SelfTest::CopyIgnored) if mode == BfMode::On => choice(
            TxPath::BlueFlame,
            "bf=on although the self-test saw BF copies ignored (no write combining)",
            true,
        ),
        Ok(SelfTest::CopyIgnored) => choice(
            TxPath::Doorbell,
            "self-test: the device ignored the BF copy (no write combining)",
            false,
        ),
        Err(e) => choice(
            TxPath::Doorbell,
            &format!("self-test failed: {e}"),
            mode == BfMode::On,
        ),
    }
}

/// Posts one NOP whose ring copy asks for no completion but whose BF copy does; a CQE for it
/// means the device used the copy. Then a signaled NOP through the doorbell tells "copy
/// ignored" apart from "device dead". A device that runs in the caller's context is polled
/// while the test waits.
pub fn self_test(dev: &dyn Device, socket: i32, copy: Copy64) -> Result<SelfTest, String> {
    on_scratch_queue(
        dev,
        socket,
        copy,
        |Scratch {
             sq,
             cq,
             qpn,
             mut bf,
             db,
         }| {
            // NOP 0: unsignaled in the ring, signaled in the BF copy.
            sq.wqe_mut(0, 1).put_nop(1, false);
            let word = u32::from(opcode::NOP); // pass 0: owner 0; counter 0
            sq.publish(0, word);
            let mut copy_blk = Txbb(sq.wqe_blocks(0, 1)[0].0);
            let mut c = CtrlSeg::new_unchecked(&mut copy_blk.0[..16]);
            let ds = c.ds();
            c.set_bf_qpn_ds(qpn, ds);
            c.set_srcrb_flags(srcrb::SOLICIT | srcrb::CQ_UPDATE);
            bf.write(&copy_blk, &[]);
            if let Some(idx) = wait_cqe(dev, cq, Duration::from_millis(100))? {
                return match idx {
                    0 => Ok(SelfTest::CopyExecuted),
                    i => Err(format!("unexpected completion for WQE {i}")),
                };
            }
            // NOP 1, signaled in the ring, through the doorbell.
            sq.wqe_mut(1, 1).put_nop(1, true);
            sq.publish(1, u32::from(opcode::NOP));
            db.ring();
            match wait_cqe(dev, cq, Duration::from_secs(2))? {
                Some(1) => Ok(SelfTest::CopyIgnored),
                Some(0) => Ok(SelfTest::CopyExecuted),
                Some(i) => Err(format!("unexpected completion for WQE {i}")),
                None => Err("the device completed no NOP within 2 s".into()),
            }
        },
    )
}

/// How long one store sequence took: a 64-byte copy into the BF register with its fences, and
/// the doorbell store with its fence (each timed alone; the fastest of several rounds, per
/// WQE; the clock reads are in both).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreTiming {
    pub bf_ns: f64,
    pub doorbell_ns: f64,
}

/// A copy this many times slower than the doorbell (eight bus writes against one, plus the
/// clock reads both include; a direct 64-byte store into cached memory is about 3)...
const UNCACHED_RATIO: f64 = 4.0;
/// ...and slower by this much: eight uncached stores cross the bus one by one (the seed's
/// 0.47 us), while a copy into cached memory (the software HCA's page) never costs that much,
/// even unoptimised or on a loaded machine (the fastest of several rounds counts).
const UNCACHED_EXTRA_NS: f64 = 300.0;

impl StoreTiming {
    /// The BF copy costs what eight uncached stores would, not one write-combined burst.
    pub fn uncached(&self) -> bool {
        self.bf_ns > UNCACHED_RATIO * self.doorbell_ns
            && self.bf_ns - self.doorbell_ns > UNCACHED_EXTRA_NS
    }
}

impl std::fmt::Display for StoreTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a BF copy took {:.0} ns against {:.0} ns for a doorbell",
            self.bf_ns, self.doorbell_ns
        )
    }
}

/// NOPs per timed round, and rounds per path.
const TIMED_NOPS: u32 = 16;
const ROUNDS: u32 = 8;

/// Times NOPs posted through the BF register against NOPs posted with the doorbell, on a
/// queue of their own. Each round writes `TIMED_NOPS` NOPs (only the last signaled) and waits
/// for its completion; the time per NOP of the fastest round of each path is kept, so that a
/// preempted round does not count.
pub fn time_stores(dev: &dyn Device, socket: i32, copy: Copy64) -> Result<StoreTiming, String> {
    on_scratch_queue(
        dev,
        socket,
        copy,
        |Scratch {
             sq,
             cq,
             qpn,
             mut bf,
             db,
         }| {
            let mut best = [f64::MAX; 2];
            let mut c: u32 = 0;
            for round in 0..2 * ROUNDS {
                let through_bf = round % 2 == 0;
                let mut spent = Duration::ZERO;
                for i in 0..TIMED_NOPS {
                    let last = i + 1 == TIMED_NOPS;
                    sq.wqe_mut(c, 1).put_nop(1, last);
                    let word = sq.owner_word(c, opcode::NOP);
                    if through_bf {
                        // As the queue does: the ring keeps a plain WQE, the copy carries the
                        // counter and the QPN.
                        let counter = (c & 0xffff) << mlx4_prm::owner_opcode::BF_COUNTER_SHIFT;
                        sq.publish(c, word);
                        let mut blk = Txbb(sq.wqe_blocks(c, 1)[0].0);
                        let mut ctrl = CtrlSeg::new_unchecked(&mut blk.0[..16]);
                        ctrl.set_owner_opcode(word | counter);
                        ctrl.set_bf_qpn_ds(qpn, 1);
                        let t = Instant::now();
                        bf.write(&blk, &[]);
                        spent += t.elapsed();
                    } else {
                        sq.publish(c, word);
                        let t = Instant::now();
                        db.ring();
                        spent += t.elapsed();
                    }
                    c = c.wrapping_add(1);
                }
                let per_nop = spent.as_nanos() as f64 / f64::from(TIMED_NOPS);
                let mask = sq.txbb_cnt() - 1;
                let want = c.wrapping_sub(1) & mask;
                match wait_cqe(dev, cq, Duration::from_secs(2))? {
                    Some(i) if u32::from(i) & mask == want => {}
                    Some(i) => return Err(format!("completion for WQE {i}, expected {want}")),
                    None => return Err("the device completed no timed NOP within 2 s".into()),
                }
                let slot = usize::from(!through_bf);
                best[slot] = best[slot].min(per_nop);
            }
            Ok(StoreTiming {
                bf_ns: best[0],
                doorbell_ns: best[1],
            })
        },
    )
}

/// A scratch SQ and CQ of the check's own, with the SQ's BF register and doorbell.
struct Scratch<'q> {
    sq: &'q mut SqRing,
    cq: &'q mut CqRing,
    qpn: u32,
    bf: BfReg,
    db: SendDoorbell,
}

/// Runs `f` on a scratch queue pair created on `dev`, destroyed again whatever `f` returns.
fn on_scratch_queue<T>(
    dev: &dyn Device,
    socket: i32,
    copy: Copy64,
    f: impl FnOnce(Scratch<'_>) -> Result<T, String>,
) -> Result<T, String> {
    let cq = dev.create_cq(16, socket).map_err(|e| e.to_string())?;
    let sq = match dev.create_sq(64, &cq, socket) {
        Ok(sq) => sq,
        Err(e) => {
            let _ = dev.destroy_cq(cq);
            return Err(e.to_string());
        }
    };
    // SAFETY: `dev` handed these descriptors out just now, one view each; the views go back
    // to `dev` for destroy before this function returns, and `dev` outlives the call.
    #[allow(unsafe_code)]
    let (mut sq, mut cq) = unsafe { (SqRing::new(sq), CqRing::new(cq)) };
    let qpn = sq.desc().qpn();
    let result = match sq.bf_reg(copy) {
        Some(bf) => {
            let db = sq.doorbell();
            f(Scratch {
                sq: &mut sq,
                cq: &mut cq,
                qpn,
                bf,
                db,
            })
        }
        None => Err("the SQ got no BF register".into()),
    };
    let _ = dev.destroy_sq(sq.into_desc());
    let _ = dev.destroy_cq(cq.into_desc());
    result
}

fn wait_cqe(dev: &dyn Device, cq: &mut CqRing, limit: Duration) -> Result<Option<u16>, String> {
    let start = Instant::now();
    while start.elapsed() < limit {
        dev.poll();
        if let Some(cqe) = cq.poll() {
            cq.update_ci();
            if cqe.opcode() == mlx4_prm::cqe_opcode::ERROR {
                return Err(format!("error CQE, syndrome {:#04x}", cqe.syndrome()));
            }
            return Ok(Some(cqe.wqe_index()));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_nops_all_execute_through_each_path() {
        use crate::hw::soft::{hca, Soft};
        let model = hca::Hca::open(hca::HcaConfig {
            wc: true,
            threaded: true,
            ..hca::HcaConfig::default()
        })
        .unwrap();
        model.start().unwrap();
        let dev = Soft::new(model.clone(), crate::mem::MemSource::Heap);
        let t = time_stores(&dev, -1, Copy64::best()).unwrap();
        assert!(t.bf_ns > 0.0 && t.doorbell_ns > 0.0, "{t:?}");
        let c = model.counters();
        assert_eq!(
            c.wqe_fetched + c.wqe_from_bf,
            u64::from(2 * ROUNDS * TIMED_NOPS),
            "every timed NOP executed: {c:?}"
        );
        assert_eq!(c.error_cqes, 0);
        assert!(c.wqe_from_bf > 0, "copies were taken: {c:?}");
        model.stop();
    }

    #[test]
    fn uncached_needs_both_the_ratio_and_the_extra_time() {
        let t = |bf_ns, doorbell_ns| StoreTiming { bf_ns, doorbell_ns };
        // Write combining on a card: one burst, about a doorbell's cost.
        assert!(!t(180.0, 150.0).uncached());
        // Uncached: eight bus writes.
        assert!(t(900.0, 140.0).uncached());
        // Cached memory (the model's page): a direct store costs a few times a plain one,
        // but never hundreds of nanoseconds more.
        assert!(!t(40.0, 8.0).uncached());
        assert!(
            !t(426.0, 160.0).uncached(),
            "a loaded machine's worst round seen"
        );
        assert!(!t(400.0, 300.0).uncached(), "slower, but not by the ratio");
        assert_eq!(
            t(900.4, 140.0).to_string(),
            "a BF copy took 900 ns against 140 ns for a doorbell"
        );
    }
}
