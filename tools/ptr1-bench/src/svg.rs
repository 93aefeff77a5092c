//! Two plots as plain SVG, both log-log against message size with a line per transport in
//! the order the tables list them: one-way throughput (iperf3 as a grey dashed level) and ask
//! round-trip p50. Series named in `dashed` (what was measured from Python) are dashed.
//!
//! Written by hand rather than with plotters: plotters lays text out with a font backend
//! (font-kit and the system's fonts, or an embedded TTF) even for SVG; here the viewer renders
//! the text, and nothing beyond std is needed.

use std::fmt::Write;

const W: f64 = 980.0;
const H: f64 = 540.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 280.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// The dash pattern of the series in `dashed`.
const PEER_DASH: &str = r#" stroke-dasharray="7 4""#;

/// Throughput against size, one line per series, log axes.
pub(crate) fn throughput(
    points: &[(String, usize, f64)],
    references: &[(String, f64)],
    dashed: &[String],
) -> String {
    lines(
        "One-way throughput by message size (medians, higher is better)",
        "GB/s",
        points,
        references,
        dashed,
    )
}

/// Round-trip p50 against size, one line per series, log axes.
pub(crate) fn latency(points: &[(String, usize, f64)], dashed: &[String]) -> String {
    lines(
        "Ask round trip p50 by message size (lower is better)",
        "µs",
        points,
        &[],
        dashed,
    )
}

/// `points` (series, size, value) as lines on log axes, `references` as grey dashed levels,
/// the series named in `dashed` dashed.
fn lines(
    title: &str,
    unit: &str,
    points: &[(String, usize, f64)],
    references: &[(String, f64)],
    dashed: &[String],
) -> String {
    // In the order of first appearance: the tables' order.
    let mut series: Vec<(&str, Vec<(f64, f64)>)> = Vec::new();
    for (name, size, value) in points {
        let point = (*size as f64, *value);
        match series.iter_mut().find(|(n, _)| n == name) {
            Some((_, pts)) => pts.push(point),
            None => series.push((name, vec![point])),
        }
    }
    let xs = points.iter().map(|p| p.1 as f64);
    let ys = points
        .iter()
        .map(|p| p.2)
        .chain(references.iter().map(|r| r.1));
    let (dx0, dx1) = decades(xs);
    let (dy0, dy1) = decades(ys);
    let (x0, x1, y0, y1) = (
        f64::from(dx0),
        f64::from(dx1),
        f64::from(dy0),
        f64::from(dy1),
    );
    let x = |v: f64| LEFT + (v.log10() - x0) / (x1 - x0) * (W - LEFT - RIGHT);
    let y = |v: f64| H - BOTTOM - (v.log10() - y0) / (y1 - y0) * (H - TOP - BOTTOM);
    let mut svg = header(title, H);
    if !dashed.is_empty() {
        let _ = write!(
            svg,
            r#"<text x="{}" y="44" text-anchor="middle" font-size="12">solid: measured from Rust (ptr1-bench) · dashed: from Python (pybind/bench/bench.py)</text>"#,
            W / 2.0
        );
    }
    axes(&mut svg, "message size (bytes)", unit);
    for d in dx0..=dx1 {
        let v = 10f64.powi(d);
        let _ = write!(
            svg,
            r##"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}" stroke="#ddd"/><text x="{0:.1}" y="{3}" text-anchor="middle" font-size="12">{4}</text>"##,
            x(v),
            TOP,
            H - BOTTOM,
            H - BOTTOM + 18.0,
            size_label(v)
        );
    }
    for d in dy0..=dy1 {
        let v = 10f64.powi(d);
        let _ = write!(
            svg,
            r##"<line x1="{1}" y1="{0:.1}" x2="{2}" y2="{0:.1}" stroke="#ddd"/><text x="{3}" y="{4:.1}" text-anchor="end" font-size="12">{5}</text>"##,
            y(v),
            LEFT,
            W - RIGHT,
            LEFT - 6.0,
            y(v) + 4.0,
            number(v)
        );
    }
    let mut legend = 0usize;
    let (mut solid, mut peer) = (0usize, 0usize);
    for (name, mut pts) in series {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Solid and dashed series each go round the colours; a solid series past the tenth
        // is dotted so that no two lines look alike.
        let (colour, dash) = if dashed.iter().any(|d| d == name) {
            peer += 1;
            (COLOURS[(peer - 1) % COLOURS.len()], PEER_DASH)
        } else {
            solid += 1;
            let dotted = solid > COLOURS.len();
            (
                COLOURS[(solid - 1) % COLOURS.len()],
                if dotted {
                    r#" stroke-dasharray="2 3""#
                } else {
                    ""
                },
            )
        };
        let path: Vec<String> = pts
            .iter()
            .map(|&(px, py)| format!("{:.1},{:.1}", x(px), y(py)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        for &(px, py) in &pts {
            let _ = write!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"><title>{} {}: {:.2} {unit}</title></circle>"#,
                x(px),
                y(py),
                escape(name),
                size_label(px),
                py
            );
        }
        legend_entry(&mut svg, legend, colour, name, dash);
        legend += 1;
    }
    for (name, gb) in references {
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#444" stroke-dasharray="6 4"/>"##,
            y(*gb),
            W - RIGHT
        );
        legend_entry(
            &mut svg,
            legend,
            "#444",
            &format!("{name} ({gb:.2} {unit})"),
            r#" stroke-dasharray="6 4""#,
        );
        legend += 1;
    }
    svg.push_str("</svg>\n");
    svg
}

fn header(title: &str, height: f64) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/><text x="{}" y="28" text-anchor="middle" font-size="17">{}</text>"#,
        W / 2.0,
        escape(title)
    )
}

fn axes(svg: &mut String, x_label: &str, y_label: &str) {
    let _ = write!(
        svg,
        r#"<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="black"/><text x="{}" y="{}" text-anchor="middle" font-size="13">{x_label}</text><text x="18" y="{}" text-anchor="middle" font-size="13" transform="rotate(-90 18 {})">{y_label}</text>"#,
        W - LEFT - RIGHT,
        H - TOP - BOTTOM,
        (LEFT + W - RIGHT) / 2.0,
        H - 16.0,
        (TOP + H - BOTTOM) / 2.0,
        (TOP + H - BOTTOM) / 2.0
    );
}

/// A legend line: `dash` is the line's `stroke-dasharray` attribute, or empty.
fn legend_entry(svg: &mut String, i: usize, colour: &str, name: &str, dash: &str) {
    let y = TOP + 12.0 + 22.0 * i as f64;
    let x = W - RIGHT + 16.0;
    let _ = write!(
        svg,
        r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/><text x="{}" y="{}" font-size="12">{}</text>"#,
        x + 24.0,
        x + 30.0,
        y + 4.0,
        escape(name)
    );
}

/// Whole decades around the values (log10), at least one decade wide.
fn decades(values: impl Iterator<Item = f64>) -> (i32, i32) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0, 1);
    }
    // log10 of a positive finite f64 lies within ±330: the conversions are exact.
    #[allow(clippy::cast_possible_truncation)]
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    (a, if b > a { b } else { a + 1 })
}

fn size_label(bytes: f64) -> String {
    match bytes {
        b if b >= 1e9 => format!("{:.0} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.0} MB", b / 1e6),
        b if b >= 1e3 => format!("{:.0} kB", b / 1e3),
        b => format!("{b:.0} B"),
    }
}

fn number(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throughput_plot_has_a_line_per_series_and_the_references() {
        let points = vec![
            ("engine".to_owned(), 4096, 0.2),
            ("engine".to_owned(), 64 << 20, 4.0),
            ("tokio <fallback>".to_owned(), 4096, 0.1),
            ("tokio <fallback>".to_owned(), 64 << 20, 3.0),
        ];
        let svg = throughput(&points, &[("iperf3".to_owned(), 5.0)], &[]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("iperf3 (5.00 GB/s)"));
        assert!(svg.contains("tokio &lt;fallback&gt;"), "names are escaped");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn a_latency_plot_has_a_line_per_series_and_empty_input_still_renders() {
        let points: Vec<(String, usize, f64)> = (0..12)
            .map(|i| (format!("series {i:02}"), 4096, 20.0 + f64::from(i)))
            .collect();
        let svg = latency(&points, &["series 03".to_owned()]);
        assert_eq!(svg.matches("<polyline").count(), 12);
        assert!(svg.contains("series 11 4 kB: 31.00 µs"));
        assert_eq!(
            svg.matches(r#"stroke-dasharray="2 3""#).count(),
            2,
            "the eleventh solid series (series 11) is dotted, line and legend"
        );
        assert_eq!(
            svg.matches(PEER_DASH).count(),
            2,
            "series 03 is dashed, line and legend"
        );
        assert!(svg.contains("dashed: from Python"));
        let first = svg.find("series 00").unwrap_or(usize::MAX);
        assert!(
            first < svg.find("series 01").unwrap_or(0),
            "in the order given"
        );
        assert!(throughput(&[], &[], &[]).ends_with("</svg>\n"));
    }
}
