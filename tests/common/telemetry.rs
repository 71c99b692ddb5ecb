//! DPDK's telemetry socket read through Debian's `dpdk-telemetry.py`, as a user reads it: one
//! client process per session, one command a line, one JSON reply a line.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use super::KillOnDrop;

pub const CLIENT: &str = "/usr/bin/dpdk-telemetry.py";

pub struct Telemetry {
    child: KillOnDrop,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Telemetry {
    /// Connects to the process that runs with EAL `--file-prefix=prefix`, once its socket
    /// exists (at most `limit`).
    pub fn connect(prefix: &str, limit: Duration) -> Telemetry {
        assert!(
            Path::new(CLIENT).exists(),
            "{CLIENT} is missing: it comes with Debian's dpdk-dev (scripts/setup.sh installs it)"
        );
        let sock = Path::new("/var/run/dpdk")
            .join(prefix)
            .join("dpdk_telemetry.v2");
        let start = Instant::now();
        while !sock.exists() {
            assert!(
                start.elapsed() < limit,
                "no telemetry socket {} after {limit:?}",
                sock.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // -u: a piped stdout would otherwise hold the replies in Python's buffer.
        let mut child = KillOnDrop(
            Command::new("python3")
                .args(["-u", CLIENT, "-f", prefix])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("python3 not found: run scripts/setup.sh"),
        );
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Telemetry {
            child,
            stdin,
            stdout,
        }
    }

    /// The reply to `cmd` (`/ethdev/xstats,0`), as the JSON line the client printed.
    pub fn query(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("telemetry client exited");
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).expect("telemetry reply");
        assert!(
            n > 0,
            "telemetry client exited without answering {cmd} (exit {:?})",
            self.child.try_wait()
        );
        line
    }

    /// Every numeric field of the innermost object of a reply such as `/ethdev/xstats,0`'s
    /// (`{"/ethdev/xstats": {"rx_good_packets": 1, ...}}`), in order.
    pub fn numbers(reply: &str) -> Vec<(String, u64)> {
        let Some(open) = reply.rfind('{') else {
            return Vec::new();
        };
        let body = &reply[open + 1..];
        let body = &body[..body.find('}').unwrap_or(body.len())];
        body.split(", ")
            .filter_map(|kv| {
                let (k, v) = kv.split_once(": ")?;
                Some((
                    k.trim().trim_matches('"').to_owned(),
                    v.trim().parse().ok()?,
                ))
            })
            .collect()
    }

    /// Port `port`'s xstats by name.
    pub fn xstats(&mut self, port: u16) -> std::collections::HashMap<String, u64> {
        self.try_xstats(port)
            .unwrap_or_else(|reply| panic!("no xstats in {reply}"))
    }

    /// Port `port`'s xstats by name, or the reply that held none (ethdev's handler answers
    /// `null` when one of its calls failed).
    #[allow(dead_code)]
    pub fn try_xstats(
        &mut self,
        port: u16,
    ) -> Result<std::collections::HashMap<String, u64>, String> {
        let reply = self.query(&format!("/ethdev/xstats,{port}"));
        let v = Self::numbers(&reply);
        if v.is_empty() {
            return Err(reply);
        }
        Ok(v.into_iter().collect())
    }
}

#[cfg(test)]
mod parse_tests {
    #[test]
    fn numbers_of_the_inner_object() {
        let r = "{\"/ethdev/xstats\": {\"rx_good_packets\": 12, \"tx_good_packets\": 7}}\n";
        assert_eq!(
            super::Telemetry::numbers(r),
            vec![
                ("rx_good_packets".to_owned(), 12),
                ("tx_good_packets".to_owned(), 7)
            ]
        );
    }
}
