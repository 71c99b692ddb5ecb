//! Command-line helpers shared by the apps: `--key value` / `--key=value` options and lists.
//! Hand-rolled so that the apps stay dependency-light and every error names the option.

use std::str::FromStr;

/// A cursor over `argv[1..]` that understands `--key value` and `--key=value`.
pub struct ArgIter {
    args: Vec<String>,
    at: usize,
    /// The value of a `--key=value` just split off.
    inline_value: Option<String>,
}

impl ArgIter {
    pub fn new<I: IntoIterator<Item = String>>(args: I) -> ArgIter {
        ArgIter {
            args: args.into_iter().collect(),
            at: 0,
            inline_value: None,
        }
    }

    /// The next option name (`--key`), or `None` at the end. A bare word is an error: every
    /// app here takes options only, so a stray word is most likely a typo.
    pub fn next_opt(&mut self) -> Result<Option<String>, String> {
        if let Some(v) = self.inline_value.take() {
            return Err(format!("unexpected value `{v}`"));
        }
        let Some(a) = self.args.get(self.at).cloned() else {
            return Ok(None);
        };
        self.at += 1;
        if !a.starts_with("--") || a.len() == 2 {
            return Err(format!("unexpected argument `{a}` (options start with --)"));
        }
        match a.split_once('=') {
            Some((k, v)) => {
                self.inline_value = Some(v.to_owned());
                Ok(Some(k.to_owned()))
            }
            None => Ok(Some(a)),
        }
    }

    /// The value of option `key`.
    pub fn value(&mut self, key: &str) -> Result<String, String> {
        if let Some(v) = self.inline_value.take() {
            return Ok(v);
        }
        let v = self
            .args
            .get(self.at)
            .cloned()
            .ok_or_else(|| format!("{key} needs a value"))?;
        self.at += 1;
        Ok(v)
    }

    /// The value of `key`, parsed.
    pub fn parsed<T: FromStr>(&mut self, key: &str) -> Result<T, String> {
        let v = self.value(key)?;
        v.parse().map_err(|_| format!("{key}: cannot parse `{v}`"))
    }

    /// Fails when a flag without value was given one (`--short=1`).
    pub fn flag(&mut self, key: &str) -> Result<(), String> {
        match self.inline_value.take() {
            Some(v) => Err(format!("{key} takes no value (got `{v}`)")),
            None => Ok(()),
        }
    }
}

/// A comma-separated list of numbers, each within `lo..=hi`.
pub fn num_list<T>(key: &str, s: &str, lo: T, hi: T) -> Result<Vec<T>, String>
where
    T: FromStr + PartialOrd + Copy + std::fmt::Display,
{
    let mut v = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let n: T = part
            .parse()
            .map_err(|_| format!("{key}: `{part}` is not a number"))?;
        if n < lo || n > hi {
            return Err(format!("{key}: {n} is outside {lo}..={hi}"));
        }
        v.push(n);
    }
    if v.is_empty() {
        return Err(format!("{key}: empty list"));
    }
    Ok(v)
}

/// A comma-separated list of TX paths.
pub fn path_list(key: &str, s: &str) -> Result<Vec<crate::Path>, String> {
    s.split(',')
        .map(|p| crate::Path::parse(p.trim()).map_err(|e| format!("{key}: {e}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(a: &[&str]) -> ArgIter {
        ArgIter::new(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn both_value_forms() {
        let mut a = it(&["--out", "x", "--rounds=3", "--short"]);
        assert_eq!(a.next_opt().unwrap().as_deref(), Some("--out"));
        assert_eq!(a.value("--out").unwrap(), "x");
        assert_eq!(a.next_opt().unwrap().as_deref(), Some("--rounds"));
        assert_eq!(a.parsed::<u32>("--rounds").unwrap(), 3);
        assert_eq!(a.next_opt().unwrap().as_deref(), Some("--short"));
        a.flag("--short").unwrap();
        assert_eq!(a.next_opt().unwrap(), None);
    }

    #[test]
    fn errors_name_the_option() {
        let mut a = it(&["--rounds"]);
        a.next_opt().unwrap();
        assert_eq!(a.value("--rounds").unwrap_err(), "--rounds needs a value");
        let mut a = it(&["--rounds", "x"]);
        a.next_opt().unwrap();
        assert!(a.parsed::<u32>("--rounds").unwrap_err().contains("`x`"));
        let mut a = it(&["stray"]);
        assert!(a.next_opt().unwrap_err().contains("stray"));
        let mut a = it(&["--short=1"]);
        a.next_opt().unwrap();
        assert!(a.flag("--short").is_err());
    }

    #[test]
    fn lists() {
        assert_eq!(num_list("--b", "1, 8,32", 1u16, 64).unwrap(), [1, 8, 32]);
        assert!(num_list("--b", "0", 1u16, 64)
            .unwrap_err()
            .contains("outside"));
        assert!(num_list("--b", "1,,2", 1u16, 64).is_err());
        assert_eq!(
            path_list("--paths", "doorbell,bf-wc").unwrap(),
            [crate::Path::Doorbell, crate::Path::BfWc]
        );
        assert!(path_list("--paths", "bf").is_err());
    }
}
