//! The port's vocabulary that the driver and the device share: queue states, port events, the
//! pause settings and the RSS key. The driver's hardware boundary and the software HCA both
//! speak in these types, so nothing converts between two copies of them.

/// Length of the Toeplitz key: 32 bits of window for each of the 36 bytes of the largest input
/// (two IPv6 addresses and two ports) need 36 + 4 bytes.
pub const RSS_KEY_LEN: usize = 40;

/// The key every RSS implementation starts from (Microsoft's sample key, also the historic
/// default of the mlx4 and many other drivers), so hashes match what users see on hardware.
pub const DEFAULT_RSS_KEY: [u8; RSS_KEY_LEN] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// A queue's state as the driver sets and observes it (a QP's RESET/RTS/ERR, a WQ's
/// RESET/RDY/ERR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueState {
    /// Created or stopped: the queue executes nothing until it is made ready. Moving a queue
    /// here forgets its position: the next `Ready` starts at WQE 0.
    Reset,
    /// Executing WQEs (SQ) or receiving (RQ).
    Ready,
    /// A WQE completed in error (or the driver moved the queue here): nothing more is executed
    /// until the queue is reset or recreated.
    Error,
}

/// Something that happened to the port, told without being polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortEvent {
    /// The link came up: the port is up and its wire has a carrier.
    LinkUp,
    /// The link went down.
    LinkDown,
    /// The device went away: nothing more is sent, received or executed. Comes once, after a
    /// `LinkDown`.
    Removed,
}

/// IEEE 802.3x flow control (pause frames) as the port is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowControl {
    /// Honour pause frames received (stop sending for the time they ask).
    pub rx_pause: bool,
    /// Send pause frames when the receive buffer passes `high_water`.
    pub tx_pause: bool,
    /// Negotiate pause with the link partner.
    pub autoneg: bool,
    /// Pause time sent, in 512-bit-time quanta.
    pub pause_time: u16,
    /// Receive buffer bytes above which a pause is sent.
    pub high_water: u32,
    /// Receive buffer bytes below which sending may resume (an XON if `send_xon`).
    pub low_water: u32,
    /// Send an XON (pause time 0) at `low_water`.
    pub send_xon: bool,
    /// Forward MAC control frames to the host instead of consuming them.
    pub mac_ctrl_frame_fwd: bool,
}

impl Default for FlowControl {
    /// mlx4_en's defaults: pause on in both directions, no autonegotiation.
    fn default() -> Self {
        FlowControl {
            rx_pause: true,
            tx_pause: true,
            autoneg: false,
            pause_time: 0xffff,
            high_water: 0,
            low_water: 0,
            send_xon: false,
            mac_ctrl_frame_fwd: false,
        }
    }
}
