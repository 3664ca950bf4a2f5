//! The page's small pieces: text escaped for HTML, ages a person reads,
//! and a bar chart as inline SVG.

use std::fmt::{self, Write as _};

use idem_core::store::{Clock, SystemClock, Timestamp};

/// Text escaped for an HTML text node or a quoted attribute value: every
/// value from a store or a request goes through it.
pub(crate) struct Esc<'a>(pub(crate) &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..at])?;
            f.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[at + 1..];
        }
        f.write_str(rest)
    }
}

/// Percent-encodes a path segment or query value.
pub(crate) fn url_part(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// A duration in milliseconds as a person reads it: `45s`, `12m`, `3h 5m`,
/// `2d 4h`.
pub(crate) fn age(ms: u64) -> String {
    let secs = ms / 1_000;
    match secs {
        0..60 => format!("{secs}s"),
        60..3_600 => format!("{}m {}s", secs / 60, secs % 60),
        3_600..86_400 => format!("{}h {}m", secs / 3_600, (secs % 3_600) / 60),
        _ => format!("{}d {}h", secs / 86_400, (secs % 86_400) / 3_600),
    }
}

/// How long ago `at` was, by this process's clock.
pub(crate) fn ago(at: Timestamp) -> String {
    let since = SystemClock.now().saturating_duration_since(at);
    age(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// How long until `at`, by this process's clock.
pub(crate) fn until(at: Timestamp) -> String {
    let left = at.saturating_duration_since(SystemClock.now());
    age(u64::try_from(left.as_millis()).unwrap_or(u64::MAX))
}

/// A horizontal bar chart of `bars` (label, value), as inline SVG: one
/// bar per figure, scaled to the largest, each labelled and titled with
/// its value.
pub(crate) fn bar_chart(title: &str, bars: &[(String, u64)]) -> String {
    const WIDTH: u64 = 520;
    const LABEL: u64 = 170;
    const ROW: u64 = 26;
    let plot = WIDTH - LABEL - 60;
    let height = ROW * bars.len().max(1) as u64 + 10;
    let largest = bars
        .iter()
        .map(|(_, value)| *value)
        .max()
        .unwrap_or(0)
        .max(1);
    let mut svg = format!(
        "<svg class=\"chart\" role=\"img\" aria-label=\"{title}\" width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" xmlns=\"http://www.w3.org/2000/svg\"><title>{title}</title>",
        title = Esc(title)
    );
    for (row, (label, value)) in bars.iter().enumerate() {
        let y = row as u64 * ROW + 5;
        let width = if *value == 0 {
            0
        } else {
            (value * plot / largest).max(2)
        };
        let _ = write!(
            svg,
            "<g class=\"bar\" data-label=\"{label}\" data-value=\"{value}\"><text x=\"{lx}\" y=\"{ty}\" text-anchor=\"end\" font-size=\"12\">{label}</text><rect x=\"{LABEL}\" y=\"{y}\" width=\"{width}\" height=\"18\" fill=\"{fill}\"><title>{label}: {value}</title></rect><text x=\"{vx}\" y=\"{ty}\" font-size=\"12\">{value}</text></g>",
            label = Esc(label),
            lx = LABEL - 8,
            ty = y + 13,
            fill = if *value == 0 { "#9ca3af" } else { "#d97706" },
            vx = LABEL + width + 6,
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_text_is_escaped() {
        assert_eq!(
            Esc("<script>alert('x')</script> & \"q\"").to_string(),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(Esc("plain").to_string(), "plain");
    }

    #[test]
    fn ages_read_as_a_person_says_them() {
        assert_eq!(age(45_000), "45s");
        assert_eq!(age(125_000), "2m 5s");
        assert_eq!(age(3 * 3_600_000 + 5 * 60_000), "3h 5m");
        assert_eq!(age(2 * 86_400_000 + 4 * 3_600_000), "2d 4h");
    }

    #[test]
    fn each_figure_is_a_bar_scaled_to_the_largest() {
        let svg = bar_chart(
            "backlog",
            &[
                ("a<b".to_string(), 10),
                ("c".to_string(), 5),
                ("d".to_string(), 0),
            ],
        );
        assert_eq!(svg.matches("<rect").count(), 3);
        assert!(svg.contains("data-label=\"a&lt;b\" data-value=\"10\""));
        assert!(
            svg.contains("width=\"290\""),
            "the largest spans the plot: {svg}"
        );
        assert!(
            svg.contains("width=\"145\""),
            "half the largest, half the plot"
        );
    }

    #[test]
    fn url_parts_are_percent_encoded() {
        assert_eq!(url_part("a b/c?d"), "a%20b%2Fc%3Fd");
    }
}
