//! testpmd's output as the harness reads it: each prompt whole, and no event lines.
//!
//! testpmd's command line writes its prompt a byte at a time (`write(2)` per byte), while the
//! other threads write whole lines: the forwarding lcore's packet dumps under `set verbose 1`,
//! EAL's interrupt thread its events. Either can land between two bytes of a prompt, and a
//! prompt that is not found whole makes every later answer one prompt late.

/// The prompt testpmd prints after each line it has processed.
pub(super) const PROMPT: &str = "testpmd> ";

/// `text` with its event lines gone and its split prompts whole again.
pub(super) fn cleaned(text: &str) -> String {
    unspliced(&without_events(text))
}

/// `text` without testpmd's event lines (`\nPort 0: link state change event\n`). They come
/// from EAL's interrupt thread at any moment, and line-buffered stdio writes one as two pieces
/// (`\nPort ` and `0: link state change event\n`), between which the main thread may write
/// part of a prompt, a byte at a time: the pieces go, whatever came between them stays.
fn without_events(text: &str) -> String {
    let mut out = text.to_owned();
    let mut from = out.len();
    while let Some(end) = out[..from].rfind(" event\n") {
        from = end;
        // `<digits>: <lowercase words> event\n`
        let head = &out[..end];
        let Some(colon) = head.rfind(": ") else { break };
        let desc_ok = head[colon + 2..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == ' ');
        let digits = head[..colon].len()
            - head[..colon]
                .trim_end_matches(|c: char| c.is_ascii_digit())
                .len();
        if !desc_ok || digits == 0 {
            continue;
        }
        let num = colon - digits;
        // `\nPort ` before the number, perhaps with prompt bytes between.
        let Some(port) = out[..num].rfind("\nPort ") else {
            continue;
        };
        let between = &out[port + "\nPort ".len()..num];
        if between.len() > PROMPT.len() || !between.chars().all(|c| PROMPT.contains(c)) {
            continue;
        }
        out.replace_range(num..end + " event\n".len(), "");
        out.replace_range(port..port + "\nPort ".len(), "");
        from = port;
    }
    out
}

/// The pieces (offset and length) of a prompt begun and not yet finished.
type Begun = Vec<(usize, usize)>;

/// How many bytes of `text` from `at` match `PROMPT` from byte `from` on.
fn matching(text: &[u8], at: usize, from: usize) -> usize {
    let want = &PROMPT.as_bytes()[from..];
    text[at..]
        .iter()
        .zip(want)
        .take_while(|(a, b)| a == b)
        .count()
}

/// `text` with each prompt that whole lines split (`tes` + `rx: ...\n` + `tpmd> `) put back
/// together where its last byte came, after the lines, which stay in the answer it closes.
///
/// A prompt begins at a line's start or right after another prompt (a command that prints
/// nothing); after a split its next bytes come at a line's start, since what split it was
/// whole lines. Where a piece ends is not known (`tes` + `tx: ...` reads `testx: ...`), so
/// each length the bytes allow is a candidate, as is a line that merely starts like a prompt
/// (`tx: flags=...`); those are never finished, and only real prompts are mended. At most
/// one prompt is in flight at a time, so a finished one ends every other candidate.
fn unspliced(text: &str) -> String {
    let b = text.as_bytes();
    let whole = PROMPT.len();
    // Candidates by the number of prompt bytes they hold.
    let mut begun: [Option<Begun>; PROMPT.len()] = Default::default();
    // Mended prompts: the pieces to drop, and where the whole prompt goes.
    let mut mended: Vec<(Begun, usize)> = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let mut next = None;
        let mut grown: Vec<(usize, Begun)> = Vec::new();
        for (have, pieces) in begun.iter().enumerate().skip(1) {
            let Some(pieces) = pieces else {
                continue;
            };
            let n = matching(b, at, have);
            if have + n == whole {
                let mut pieces = pieces.clone();
                pieces.push((at, n));
                mended.push((pieces, at + n));
                next = Some(at + n);
                break;
            }
            for k in (1..=n).filter(|k| at + k < b.len()) {
                let mut pieces = pieces.clone();
                pieces.push((at, k));
                grown.push((have + k, pieces));
            }
        }
        let here = matching(b, at, 0);
        if next.is_none() && here == whole {
            next = Some(at + whole);
        }
        if next.is_some() {
            begun = Default::default();
        } else {
            for (have, pieces) in grown {
                begun[have] = Some(pieces);
            }
            for k in (1..=here).filter(|k| at + k < b.len()) {
                begun[k] = Some(vec![(at, k)]);
            }
        }
        at = next.unwrap_or_else(|| {
            b[at..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |i| at + i + 1)
        });
    }
    if mended.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    let mut cuts: Vec<(usize, usize, bool)> = Vec::new();
    for (pieces, end) in &mended {
        for &(p, n) in pieces {
            cuts.push((p, p + n, p + n == *end));
        }
    }
    cuts.sort_unstable();
    for (start, end, last) in cuts {
        out.push_str(&text[from..start]);
        if last {
            out.push_str(PROMPT);
        }
        from = end;
    }
    out.push_str(&text[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::{cleaned, unspliced, without_events};

    #[test]
    fn event_lines_go_even_across_a_prompt() {
        let t = "Done\ntes\nPort tpmd> 0: link state change event\nshow\nPort 1: device removal event\n";
        assert_eq!(without_events(t), "Done\ntestpmd> show");
    }

    #[test]
    fn a_prompt_split_by_whole_lines_is_whole_after_them() {
        // As seen under `set verbose 1` while the csum engine forwarded.
        let t = "RX-packets: 9\ntesrx: l2_len=14\ntx: flags=IP\n----\ntpmd> port 0: 32\n";
        assert_eq!(
            unspliced(t),
            "RX-packets: 9\nrx: l2_len=14\ntx: flags=IP\n----\ntestpmd> port 0: 32\n"
        );
        // In three pieces, after a prompt of a command that printed nothing.
        let t = "testpmd> tsrc=1\nes\n  ol\ntpmd> tx: a\n";
        assert_eq!(unspliced(t), "testpmd> src=1\n\n  ol\ntestpmd> tx: a\n");
    }

    #[test]
    fn pieces_whose_ends_the_lines_hide() {
        // Seen under the csum engine: `t`, `es`, `tp`, `m`, `d`, `> ` between its dump lines.
        let t = "trx: 1\nestx: m\ntptx: f\nm----\ndport=0\n> rx: 2\n";
        assert_eq!(
            unspliced(t),
            "rx: 1\ntx: m\ntx: f\n----\nport=0\ntestpmd> rx: 2\n"
        );
        let t = "testx: a\ntpmd> ";
        assert_eq!(unspliced(t), "tx: a\ntestpmd> ");
    }

    #[test]
    fn lines_that_start_like_a_prompt_stay() {
        let t = "tx: flags=IP\ntest\ntestpmd> te\nt\n";
        assert_eq!(unspliced(t), t);
        // Not yet finished: it is mended once its last bytes come.
        let t = "ok\ntes\nrx: 1\ntpm";
        assert_eq!(unspliced(t), t);
        let t = format!("{t}d> ");
        assert_eq!(unspliced(&t), "ok\n\nrx: 1\ntestpmd> ");
    }

    #[test]
    fn events_and_split_prompts_together() {
        let t = "a\nte\nPort 0: link state change event\nstpmd> b\ntes\nrx: 1\ntpmd> ";
        let c = cleaned(t);
        assert_eq!(c.matches("testpmd> ").count(), 2, "{c:?}");
        assert!(c.ends_with("rx: 1\ntestpmd> "), "{c:?}");
    }
}
