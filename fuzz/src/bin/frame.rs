//! The software HCA's frame parser (RX classification, flow fields, VXLAN, the TSO template,
//! RSS input, checksum filling) over any bytes a wire can deliver.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        mlx4_hca::fuzzing::parse_frame(data);
    });
}
