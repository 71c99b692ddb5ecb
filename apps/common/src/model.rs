//! The bus cost model: turns what the driver and the (software) device counted per packet into
//! the latency and packet rate a ConnectX-3 on PCIe would show. Every parameter sits in
//! [`PUBLISHED`] with its source; everything this module returns is a model and the apps label
//! it "modeled" wherever it is printed.
//!
//! Latency of one message through the TX path:
//!   base + fetches * t_fetch + torn_pieces * t_piece + gathers * t_fetch + wire bytes * t_byte
//! - `base`: BlueFlame with WC, small message: the WQE arrives with the write, nothing to fetch.
//! - `t_fetch`: what a doorbell costs over that: the device's DMA read of the WQE (WC thread:
//!   doorbell 1.10 us vs BF 0.79 us).
//! - `t_piece`: one uncached 8-byte store of a BlueFlame copy on a page without WC (the copy
//!   tears, the device fetches anyway): 1.47 us vs 1.00 us at 128 bytes, spread over the pieces
//!   of a 128-byte inline WQE.
//! - a gather WQE costs a second DMA read for the payload (assumed equal to `t_fetch`).
//!
//! Packet rate of one core: 1 / (t_pkt + doorbells * t_db + bf_writes * t_bf + pieces * t_piece)
//! capped at 40GbE line rate, with t_pkt and t_db solved from the xmit_more thread's two points
//! (4.5 Mpps with a doorbell per packet, 14.9 Mpps with one per 8 packets).

/// What the driver and the device counted, per packet.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PerPacket {
    pub doorbells: f64,
    pub bf_writes: f64,
    /// 8-byte pieces of torn BlueFlame copies (no WC).
    pub torn_pieces: f64,
    /// WQEs the device read from ring memory.
    pub wqe_fetches: f64,
    /// Packets whose payload the device had to read (not inline).
    pub gathers: f64,
}

/// The published measurements the model is calibrated on.
#[derive(Debug, Clone, Copy)]
pub struct Published {
    /// mlx4 write-combining thread (netdev): one-way latency, small messages, BF with WC.
    pub lat_bf_wc_small_us: f64,
    /// Same thread, doorbell path.
    pub lat_db_small_us: f64,
    /// BlueFlame-without-WC report: 128-byte messages, BF forced on a non-WC mapping.
    pub lat_bf_nowc_128_us: f64,
    /// Same report, doorbell path.
    pub lat_db_128_us: f64,
    /// xmit_more thread (netdev), 40GbE, 64-byte frames: a doorbell per packet.
    pub mpps_db_every_packet: f64,
    /// Same, one doorbell per burst of 8.
    pub mpps_db_every_8: f64,
    pub link_gbps: f64,
}

pub const PUBLISHED: Published = Published {
    lat_bf_wc_small_us: 0.79,
    lat_db_small_us: 1.10,
    lat_bf_nowc_128_us: 1.47,
    lat_db_128_us: 1.00,
    mpps_db_every_packet: 4.5,
    mpps_db_every_8: 14.9,
    link_gbps: 40.0,
};

/// Preamble, start delimiter and inter-frame gap: bytes a frame occupies beyond its own.
const WIRE_OVERHEAD: f64 = 20.0;

/// The derived parameters, in microseconds (latency) and nanoseconds (rate).
#[derive(Debug, Clone, Copy)]
pub struct Model {
    pub base_us: f64,
    pub t_fetch_us: f64,
    pub t_piece_us: f64,
    pub t_byte_us: f64,
    pub t_pkt_ns: f64,
    pub t_db_ns: f64,
    /// No published figure separates a 64-byte WC flush from a doorbell store on the CPU side;
    /// assumed equal.
    pub t_bf_ns: f64,
    pub pieces_at_128: f64,
}

impl Model {
    /// Derives the parameters; `pieces_at_128` is how many 8-byte stores a BlueFlame copy of a
    /// 128-byte inline WQE takes (the copy goes out in whole 64-byte chunks).
    pub fn new(p: &Published, pieces_at_128: f64) -> Model {
        let ns_db1 = 1e3 / p.mpps_db_every_packet;
        let ns_db8 = 1e3 / p.mpps_db_every_8;
        // t_pkt + t_db = ns_db1 and t_pkt + t_db / 8 = ns_db8.
        let t_db = (ns_db1 - ns_db8) * 8.0 / 7.0;
        Model {
            base_us: p.lat_bf_wc_small_us,
            t_fetch_us: p.lat_db_small_us - p.lat_bf_wc_small_us,
            t_piece_us: (p.lat_bf_nowc_128_us - p.lat_db_128_us) / pieces_at_128,
            t_byte_us: 8.0 / (p.link_gbps * 1e3),
            t_pkt_ns: ns_db1 - t_db,
            t_db_ns: t_db,
            t_bf_ns: t_db,
            pieces_at_128,
        }
    }

    /// The model for this driver's WQE layout.
    pub fn mlx4rs() -> Model {
        let wqe = mlx4rs::wqe::inline_wqe_bytes(128);
        Model::new(&PUBLISHED, (wqe.div_ceil(64) * 64 / 8) as f64)
    }

    /// Modeled one-way latency of a `frame`-byte message, in microseconds.
    pub fn latency_us(&self, c: &PerPacket, frame: usize) -> f64 {
        self.base_us
            + (c.wqe_fetches + c.gathers) * self.t_fetch_us
            + c.torn_pieces * self.t_piece_us
            + frame as f64 * self.t_byte_us
    }

    /// Modeled packet rate of one core, in Mpps.
    pub fn mpps(&self, c: &PerPacket, frame: usize) -> f64 {
        let ns = self.t_pkt_ns
            + c.doorbells * self.t_db_ns
            + c.bf_writes * self.t_bf_ns
            + c.torn_pieces * self.t_piece_us * 1e3;
        (1e3 / ns).min(self.line_rate_mpps(frame))
    }

    pub fn line_rate_mpps(&self, frame: usize) -> f64 {
        PUBLISHED.link_gbps * 1e3 / ((frame.max(60) as f64 + WIRE_OVERHEAD) * 8.0)
    }

    /// The parameter table for reports.
    pub fn describe(&self) -> String {
        let p = PUBLISHED;
        format!(
            "| parameter | value | source |\n|---|---|---|\n\
| base latency (BF with WC, small) | {:.2} us | mlx4 write-combining thread: BF with WC {} us |\n\
| t_fetch (doorbell-triggered WQE read; also a gather payload read) | {:.2} us | same thread: doorbell {} us - BF {} us |\n\
| t_piece (one 8-byte store of a torn BF copy) | {:.1} ns | BF without WC {} us - doorbell {} us at 128 B, over {} pieces |\n\
| t_byte (serialisation) | {:.2} ns | {} GbE line rate |\n\
| t_pkt (CPU per packet, no MMIO) | {:.1} ns | xmit_more thread: {} Mpps (doorbell per packet) and {} Mpps (burst 8) |\n\
| t_db (one doorbell MMIO) | {:.1} ns | same two points |\n\
| t_bf (one BF copy, WC flush) | {:.1} ns | assumed equal to t_db (no published figure) |\n",
            self.base_us,
            p.lat_bf_wc_small_us,
            self.t_fetch_us,
            p.lat_db_small_us,
            p.lat_bf_wc_small_us,
            self.t_piece_us * 1e3,
            p.lat_bf_nowc_128_us,
            p.lat_db_128_us,
            self.pieces_at_128,
            self.t_byte_us * 1e3,
            p.link_gbps,
            self.t_pkt_ns,
            p.mpps_db_every_packet,
            p.mpps_db_every_8,
            self.t_db_ns,
            self.t_bf_ns,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model must give back the measurements it was calibrated on.
    #[test]
    fn reproduces_its_sources() {
        let m = Model::new(&PUBLISHED, 24.0);
        let bf = PerPacket {
            bf_writes: 1.0,
            ..PerPacket::default()
        };
        let db = PerPacket {
            doorbells: 1.0,
            wqe_fetches: 1.0,
            ..PerPacket::default()
        };
        let bf_nowc = PerPacket {
            bf_writes: 1.0,
            wqe_fetches: 1.0,
            torn_pieces: 24.0,
            ..PerPacket::default()
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(m.latency_us(&bf, 0), 0.79));
        assert!(close(m.latency_us(&db, 0), 1.10));
        // The 128-byte report came from another machine whose doorbell took 1.00 us: the
        // difference is what the model keeps.
        assert!(close(
            m.latency_us(&bf_nowc, 0) - m.latency_us(&db, 0),
            1.47 - 1.00
        ));
        let db1 = m.mpps(&db, 64);
        let db8 = m.mpps(
            &PerPacket {
                doorbells: 1.0 / 8.0,
                ..PerPacket::default()
            },
            64,
        );
        assert!((db1 - 4.5).abs() < 1e-9, "{db1}");
        assert!((db8 - 14.9).abs() < 1e-9, "{db8}");
        // Line rate caps a cheap path: 64-byte frames at 40GbE are 59.5 Mpps.
        assert!((m.line_rate_mpps(64) - 59.52).abs() < 0.01);
        assert!(m.mpps(&PerPacket::default(), 1500) <= m.line_rate_mpps(1500));
    }

    #[test]
    fn this_driver_has_24_pieces_at_128_bytes() {
        assert_eq!(Model::mlx4rs().pieces_at_128, 24.0);
        assert!(Model::mlx4rs().describe().contains("xmit_more"));
    }
}
