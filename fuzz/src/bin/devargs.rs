//! Devargs as EAL hands them over (`key=value,...`, any bytes): parsing either succeeds or
//! names what is wrong; it never panics. A wire value parses the same through the model.
use std::str::FromStr;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let Ok(s) = std::str::from_utf8(data) else {
            return;
        };
        match mlx4rs::devargs::Devargs::from_str(s) {
            Ok(_) => {}
            Err(e) => assert!(
                !e.to_string().is_empty(),
                "an error without a message: {s:?}"
            ),
        }
        let _ = mlx4_hca::Wire::from_str(s);
        let _ = mlx4rs::devargs::parse_mac(s);
    });
}
