//! The console's HTML: escaping, the page frame, tables, times and the SVG charts. Pages
//! are built as strings server-side; everything interpolated goes through [`esc`].

use std::fmt::Write;

/// Text escaped for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A time in ms since the epoch as `YYYY-MM-DD HH:MM:SS` UTC (0: "—").
pub fn time(ms: u64) -> String {
    if ms == 0 {
        return "—".into();
    }
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A time as an HTML `<time>` element (machine-readable, UTC).
pub fn time_el(ms: u64) -> String {
    if ms == 0 {
        return "—".into();
    }
    let t = time(ms);
    format!("<time datetime=\"{}Z\">{t}</time>", t.replace(' ', "T"))
}

/// `YYYY-MM-DD HH:MM[:SS]` or `YYYY-MM-DDTHH:MM` (UTC) as ms since the epoch.
pub fn parse_time(s: &str) -> Option<u64> {
    let s = s.trim().trim_end_matches('Z');
    if s.is_empty() {
        return None;
    }
    let (date, clock) = s.split_once(['T', ' ']).unwrap_or((s, "00:00"));
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut c = clock.split(':').map(|p| p.parse::<i64>().ok());
    let (h, min) = (c.next()??, c.next()??);
    let sec = c.next().flatten().unwrap_or(0);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || sec > 59 {
        return None;
    }
    let days = days_from_civil(y, m, day);
    let ms = ((days * 86_400 + h * 3600 + min * 60 + sec) * 1000)
        .try_into()
        .ok()?;
    Some(ms)
}

/// A duration in ms, short (`850 ms`, `12 s`, `3 min`, `5 h`, `2 d`).
pub fn age(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=119_999 => format!("{} s", ms / 1000),
        120_000..=7_199_999 => format!("{} min", ms / 60_000),
        7_200_000..=172_799_999 => format!("{} h", ms / 3_600_000),
        _ => format!("{} d", ms / 86_400_000),
    }
}

// Howard Hinnant's civil-from-days and days-from-civil.
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A table: a caption (for screen readers and the eye), column headers, rows of cells
/// already HTML. An empty table says so.
pub fn table(caption: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<div class=\"scroll\"><table><caption>{}</caption><thead><tr>",
        esc(caption)
    );
    for h in headers {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(
            out,
            "<tr><td colspan=\"{}\" class=\"empty\">Nothing here.</td></tr>",
            headers.len()
        );
    }
    for r in rows {
        out.push_str("<tr>");
        for c in r {
            let _ = write!(out, "<td>{c}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    out
}

/// A line chart of `points` (x: seconds ago, left to right; y from 0), labelled for
/// screen readers with its last value.
pub fn chart(title: &str, unit: &str, points: &[f64], span_s: u64) -> String {
    let (w, h) = (600.0, 160.0);
    let max = points.iter().cloned().fold(0.0_f64, f64::max).max(1e-9);
    let last = points.last().copied().unwrap_or(0.0);
    let n = points.len().max(2) as f64 - 1.0;
    let mut path = String::new();
    for (i, v) in points.iter().enumerate() {
        let x = i as f64 / n * w;
        let y = h - v / max * (h - 10.0);
        let _ = write!(path, "{}{x:.1},{y:.1} ", if i == 0 { "M" } else { "L" });
    }
    let label = format!(
        "{title}: now {}{unit}, peak {}{unit} over the last {}",
        num(last),
        num(max.max(0.0)),
        age(span_s * 1000)
    );
    format!(
        "<figure class=\"chart\"><figcaption>{t} <span class=\"muted\">now {now}{u} · peak {peak}{u}</span></figcaption>\
<svg viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{l}\" preserveAspectRatio=\"none\">\
<line x1=\"0\" y1=\"{h}\" x2=\"{w}\" y2=\"{h}\" class=\"axis\"/>\
<path d=\"{path}\" class=\"line\"/></svg>\
<div class=\"axis-labels\"><span>−{span}</span><span>now</span></div></figure>",
        t = esc(title),
        now = num(last),
        u = esc(unit),
        peak = num(if points.is_empty() { 0.0 } else { max }),
        l = esc(&label),
        span = age(span_s * 1000),
    )
}

/// A small sparkline of `points` (no axes), or a dash when there are none.
pub fn sparkline(label: &str, points: &[u64]) -> String {
    if points.len() < 2 {
        return "<span class=\"muted\">—</span>".into();
    }
    let (w, h) = (100.0, 20.0);
    let max = points.iter().copied().max().unwrap_or(0).max(1) as f64;
    let n = points.len() as f64 - 1.0;
    let mut path = String::new();
    for (i, v) in points.iter().enumerate() {
        let x = i as f64 / n * w;
        let y = h - 1.0 - *v as f64 / max * (h - 2.0);
        let _ = write!(path, "{}{x:.1},{y:.1} ", if i == 0 { "M" } else { "L" });
    }
    format!(
        "<svg class=\"spark\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{}\"><path d=\"{path}\" class=\"line\"/></svg>",
        esc(label)
    )
}

/// A number for people: integers as such, others with two decimals.
pub fn num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.2}")
    }
}

/// A hidden field of a form.
pub fn hidden(name: &str, value: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
        esc(name),
        esc(value)
    )
}

/// A hidden CSRF field for a form.
pub fn csrf_field(token: &str) -> String {
    hidden("csrf", token)
}

/// `n` and `one` (or its plural, with an `s`).
pub fn plural(n: impl Into<i64>, one: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            super::esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(crate::http::percent_encode("a b/ü"), "a%20b%2F%C3%BC");
    }

    #[test]
    fn times_print_and_parse_as_utc() {
        assert_eq!(super::time(0), "—");
        assert_eq!(super::time(1_700_000_000_123), "2023-11-14 22:13:20");
        assert_eq!(
            super::parse_time("2023-11-14 22:13:20"),
            Some(1_700_000_000_000)
        );
        assert_eq!(
            super::parse_time("2023-11-14T22:13"),
            Some(1_699_999_980_000)
        );
        assert_eq!(super::parse_time("2023-11-14"), Some(1_699_920_000_000));
        for bad in ["", "yesterday", "2023-13-01", "2023-11-14 25:00"] {
            assert_eq!(super::parse_time(bad), None, "{bad}");
        }
        for ms in [86_400_000u64, 951_782_400_000, 4_102_444_800_000] {
            assert_eq!(super::parse_time(&super::time(ms)), Some(ms));
        }
    }
}
