//! The capability check that decides, once per port at device init, whether the BlueFlame
//! path is live: the device must report a BF register, the CPU must be able to map it
//! write-combining (PAT on x86), and a functional self-test must show that the device really
//! executed a WQE that arrived as a BF copy (the approach of mlx5's `mlx5_core_test_wc`).

use std::time::{Duration, Instant};

use mlx4_prm::{opcode, srcrb, CtrlSeg};

use crate::devargs::BfMode;
use crate::hw::Device;
use crate::mmio::{cpu_has_pat, Copy64, Txbb};
use crate::ring::{CqRing, SqRing};
use crate::txq::TxPath;
use crate::wqe;

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
        Ok(SelfTest::CopyExecuted) => choice(
            TxPath::BlueFlame,
            "self-test: the device executed a BF copy (write combining works)",
            false,
        ),
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
    let cq = dev.create_cq(16, socket).map_err(|e| e.to_string())?;
    let sq = match dev.create_sq(64, &cq, socket) {
        Ok(sq) => sq,
        Err(e) => {
            let _ = dev.destroy_cq(cq);
            return Err(e.to_string());
        }
    };
    let (mut sq, mut cq) = (SqRing::new(sq), CqRing::new(cq));
    let qpn = sq.desc().qpn();
    let result = (|| {
        let mut bf = sq.bf_reg(copy).ok_or("the SQ got no BF register")?;
        let db = sq.doorbell();
        // NOP 0: unsignaled in the ring, signaled in the BF copy.
        wqe::write_nop(&mut sq.wqe_mut(0, 1), 1, false);
        let word = u32::from(opcode::NOP); // pass 0: owner 0; counter 0
        sq.publish(0, word);
        let mut copy_blk = Txbb(sq.wqe_blocks(0, 1)[0].0);
        let mut c = CtrlSeg::new_unchecked(&mut copy_blk.0[..16]);
        let ds = c.ds();
        c.set_bf_qpn_ds(qpn, ds);
        c.set_srcrb_flags(srcrb::SOLICIT | srcrb::CQ_UPDATE);
        bf.write(&copy_blk, &[]);
        if let Some(idx) = wait_cqe(dev, &mut cq, Duration::from_millis(100))? {
            return match idx {
                0 => Ok(SelfTest::CopyExecuted),
                i => Err(format!("unexpected completion for WQE {i}")),
            };
        }
        // NOP 1, signaled in the ring, through the doorbell.
        wqe::write_nop(&mut sq.wqe_mut(1, 1), 1, true);
        sq.publish(1, u32::from(opcode::NOP));
        db.ring();
        match wait_cqe(dev, &mut cq, Duration::from_secs(2))? {
            Some(1) => Ok(SelfTest::CopyIgnored),
            Some(0) => Ok(SelfTest::CopyExecuted),
            Some(i) => Err(format!("unexpected completion for WQE {i}")),
            None => Err("the device completed no NOP within 2 s".into()),
        }
    })();
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
