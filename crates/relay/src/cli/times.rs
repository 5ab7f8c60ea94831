//! Times as people type them: `--from -1h`, `--to 2026-12-04T02:30:00Z`, or epoch
//! milliseconds as the API takes them.

use anyhow::{anyhow, bail};

/// `--from` and `--to` of a listing or a replay: when a DLQ row was dead-lettered, when a
/// quarantined request was received.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Window {
    /// Only what happened at or after this time: RFC 3339, a span before now (-1h, -30m,
    /// -2d), now, or epoch milliseconds.
    #[arg(long, alias = "from-ms", allow_hyphen_values = true)]
    pub from: Option<String>,
    /// Only what happened before this time (as --from).
    #[arg(long, alias = "to-ms", allow_hyphen_values = true)]
    pub to: Option<String>,
}

impl Window {
    /// The window in epoch milliseconds, each end read against `now_ms` ([`parse`]).
    pub fn ms(&self, now_ms: u64) -> anyhow::Result<(Option<u64>, Option<u64>)> {
        let at = |t: &Option<String>| t.as_deref().map(|t| parse(t, now_ms)).transpose();
        Ok((at(&self.from)?, at(&self.to)?))
    }
}

/// A time in milliseconds since the epoch from `text`: epoch milliseconds (`1764815400000`),
/// RFC 3339 (`2026-12-04T02:30:00Z`, `2026-12-04T03:30:00.250+01:00`), `now`, or a span
/// before now (`-90s`, `-15m`, `-1h`, `-2d`).
pub fn parse(text: &str, now_ms: u64) -> anyhow::Result<u64> {
    let t = text.trim();
    if t == "now" {
        return Ok(now_ms);
    }
    if let Some(span) = t.strip_prefix('-') {
        let unit = span.trim_start_matches(|c: char| c.is_ascii_digit());
        let n: u64 = span[..span.len() - unit.len()]
            .parse()
            .map_err(|_| anyhow!("{text:?}: a span is -<number><s|m|h|d>, e.g. -1h"))?;
        let ms = match unit {
            "s" => 1_000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => bail!("{text:?}: a span's unit is s, m, h or d (e.g. -1h)"),
        };
        return Ok(now_ms.saturating_sub(n.saturating_mul(ms)));
    }
    if t.bytes().all(|b| b.is_ascii_digit()) && !t.is_empty() {
        return t.parse().map_err(|_| anyhow!("{text:?}: too large"));
    }
    rfc3339(t).ok_or_else(|| {
        anyhow!("{text:?}: give RFC 3339 (2026-12-04T02:30:00Z), a span before now (-1h), or epoch milliseconds")
    })
}

/// `YYYY-MM-DDTHH:MM:SS[.fff…](Z|±HH:MM)` to epoch milliseconds.
fn rfc3339(t: &str) -> Option<u64> {
    let b = t.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = t.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        let digits = t[i + 1..].bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let frac = &t[i + 1..i + 1 + digits.min(3)];
        ms = frac.parse::<i64>().ok()? * 10i64.pow(3 - frac.len() as u32);
        i += 1 + digits;
    }
    let offset_min = match &t[i..] {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) && &o[3..4] == ":" => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (h * 60 + m)
        }
        _ => return None,
    };
    // Days from 1970-01-01 to the civil date (the proleptic Gregorian calendar).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3_600 + min * 60 + sec - offset_min * 60;
    u64::try_from(secs * 1_000 + ms).ok()
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn each_form_reads_and_what_the_listings_print_reads_back() {
        let now = 1_764_815_400_000; // 2025-12-04T02:30:00Z
        assert_eq!(parse("2025-12-04T02:30:00Z", 0).unwrap(), now);
        assert_eq!(
            parse("2025-12-04T03:30:00.250+01:00", 0).unwrap(),
            now + 250
        );
        assert_eq!(parse("2025-12-04T02:30:00.5Z", 0).unwrap(), now + 500);
        assert_eq!(parse("1764815400000", 0).unwrap(), now);
        assert_eq!(parse("-1h", now).unwrap(), now - 3_600_000);
        assert_eq!(parse("-90s", now).unwrap(), now - 90_000);
        assert_eq!(parse("-2d", now).unwrap(), now - 2 * 86_400_000);
        assert_eq!(parse("now", now).unwrap(), now);
        assert_eq!(parse("1970-01-01T00:00:00Z", 0).unwrap(), 0);
        assert_eq!(parse("2000-02-29T12:00:00Z", 0).unwrap(), 951_825_600_000);
        // What `when` prints (the stamp before the parenthesis) reads back.
        for ms in [0, 951_825_600_123, now, 4_102_444_800_000] {
            let printed = super::super::client::when(ms, now);
            let stamp = printed.split(' ').next().unwrap();
            assert_eq!(parse(stamp, now).unwrap(), ms, "{printed}");
        }
        for bad in [
            "",
            "yesterday",
            "-1w",
            "-h",
            "2025-13-01T00:00:00Z",
            "2025-12-04",
            "2025-12-04T02:30:00",
        ] {
            assert!(parse(bad, now).is_err(), "{bad:?}");
        }
    }
}
