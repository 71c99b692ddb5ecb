//! The receive delivery: frames from the port's receive buffer (or a cable's ring) offered to
//! the flow rules, the filters, steering and their RQ.

use super::*;

/// Received frames handled per poll, so TX doorbells are not starved by a receive flood.
const RX_BUDGET: usize = 64;

impl DevState {
    pub(super) fn poll_rx(&mut self) -> usize {
        let mut work = self.wire.poll_rx(&self.port, RX_BUDGET);
        if let Some(ring) = self.wire.cable().map(|c| c.rx.clone()) {
            if ring.pending() != 0 {
                work += ring.consume(RX_BUDGET, |frame| self.receive(frame) == Rx::Done);
            }
            self.fold_wire_drops();
        }
        if self.port.has_pending() {
            let port = self.port.clone();
            work += port
                .inbox
                .consume(RX_BUDGET, |frame| self.receive(frame) == Rx::Done);
        }
        self.flush_rx_cq();
        work
    }

    /// Write what the CQ that received last holds for its partner.
    fn flush_rx_cq(&mut self) {
        if let Some(cq) = self.rx_cq.take().and_then(|s| self.cqs.get_mut(s)) {
            cq.flush();
        }
    }

    /// Offer one frame to the port: flow rules, else the filters and the default RSS; the
    /// MTU; then its RQ.
    #[inline(always)]
    fn receive(&mut self, frame: &[u8]) -> Rx {
        // The headers are parsed once (or remembered from the last frame of the flow); the RSS
        // hash and the RQ's classification read what was found.
        let rx = &mut self.rx;
        rx.memo.find(frame, &rx.toeplitz, rx.rss_fields);
        let (heads, port_hash) = (self.rx.memo.heads(), self.rx.memo.hash());
        let lay = heads.lay.as_ref();
        let verdict = if self.flows.is_empty() {
            None
        } else {
            self.flows.lookup(&net::frame_fields(frame), frame.len())
        };
        let (qpn, hash) = match verdict {
            Some(Verdict::Drop) => {
                self.counters.rx_drops_flow += 1;
                return Rx::Done;
            }
            Some(v) => {
                if !self.rx.mtu_passes(heads.l3_len, &mut self.counters) {
                    return Rx::Done;
                }
                match v {
                    Verdict::Queue(q) => (Some(q), port_hash),
                    Verdict::Rss(slot) => match self.flows.ctx(slot) {
                        Some(c) => {
                            let h = net::rss_hash_of(frame, lay, &c.toeplitz, c.ctx.fields);
                            let rqs = &c.ctx.rqs;
                            (rqs.get(h as usize % rqs.len().max(1)).copied(), h)
                        }
                        None => (None, 0),
                    },
                    Verdict::Drop => unreachable!("handled above"),
                }
            }
            None => {
                if !self.rx.filters_pass(frame, &mut self.counters)
                    || !self.rx.mtu_passes(heads.l3_len, &mut self.counters)
                {
                    return Rx::Done;
                }
                (self.rx.steer(port_hash, &self.rqs), port_hash)
            }
        };
        let Some(qpn) = qpn else {
            self.counters.rx_drops_no_wqe += 1;
            return Rx::Done;
        };
        let slot = qp_slot(qpn);
        let rq = match self.qps.get_mut(slot) {
            Some(Qp::Rq(rq)) => rq,
            // A steering entry whose RQ was destroyed: nowhere to put the frame.
            _ => {
                self.counters.rx_drops_no_wqe += 1;
                return Rx::Done;
            }
        };
        let cq_at = cq_slot(rq.cqn);
        // The CQEs of consecutive frames pair up in their CQ's lines; one that goes to
        // another CQ ends the pairing in the last one.
        if let Some(prev) = self.rx_cq.filter(|&s| s != cq_at) {
            if let Some(cq) = self.cqs.get_mut(prev) {
                cq.flush();
            }
        }
        self.rx_cq = Some(cq_at);
        match self.cqs.get_mut(cq_at) {
            Some(cq) => rq.receive(
                frame,
                heads,
                hash,
                &self.mrs,
                cq,
                &mut self.counters,
                &mut self.faults.rx_error,
            ),
            None => {
                self.counters.rx_drops_no_wqe += 1;
                Rx::Done
            }
        }
    }
}
