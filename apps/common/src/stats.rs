//! Order statistics over samples (medians of rounds, latency percentiles).

/// The `p`-th percentile (0..=100) by nearest rank; `None` for no samples.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Median of unsorted samples (the lower middle for an even count, so it is always a sample).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        None
    } else {
        Some(s[(s.len() - 1) / 2])
    }
}

/// The `ib_write_lat` columns of one message size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatSummary {
    pub n: usize,
    pub min: f64,
    pub max: f64,
    pub typical: f64,
    pub avg: f64,
    pub stdev: f64,
    pub p99: f64,
    pub p999: f64,
}

pub fn summarize(samples: &[f64]) -> Option<LatSummary> {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return None;
    }
    let avg = s.iter().sum::<f64>() / n as f64;
    let var = s.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
    Some(LatSummary {
        n,
        min: s[0],
        max: s[n - 1],
        typical: s[(n - 1) / 2],
        avg,
        stdev: var.sqrt(),
        p99: percentile(&s, 99.0)?,
        p999: percentile(&s, 99.9)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_median() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.0));
        assert_eq!(median(&[]), None);
        let s = summarize(&[2.0, 1.0, 3.0]).unwrap();
        assert_eq!((s.min, s.typical, s.max, s.n), (1.0, 2.0, 3.0, 3));
        assert!((s.avg - 2.0).abs() < 1e-12);
        assert!(summarize(&[]).is_none());
    }
}
