//! The suite's two plots, drawn with plotters (its SVG backend) from a `results.json`: one-way
//! throughput and ask round-trip p50 against message size, log-log, one line per column in the
//! tables' order, the peers (measured from Python) dashed, iperf3 as a grey level. The suite
//! draws them after a run; `ptr1-bench plot --from results.json` redraws a saved run.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use serde_json::Value;

/// One line of a plot.
#[derive(Debug, PartialEq)]
pub(crate) struct Series {
    pub(crate) name: String,
    /// (message size in bytes, figure), by size.
    pub(crate) points: Vec<(f64, f64)>,
    /// Measured from Python (drawn dashed).
    pub(crate) peer: bool,
}

/// Writes `throughput.svg` and `latency.svg` for the run in `results` into `dir`.
pub(crate) fn write(results: &Value, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let iperf3 = results["references"]["iperf3_gb_per_s"]["median"].as_f64();
    let mut throughput = series(results, "oneway", false);
    throughput.push(memcpy(results));
    let latency = series(results, "rtt", true);
    let mut written = Vec::new();
    for (file, svg) in [
        (
            "throughput.svg",
            draw(
                "One-way throughput by message size (medians, higher is better)",
                "GB/s",
                &throughput,
                iperf3.map(|gb| ("iperf3 loopback", gb)),
            )?,
        ),
        (
            "latency.svg",
            draw(
                "Ask round trip p50 by message size (medians, lower is better)",
                "µs",
                &latency,
                None,
            )?,
        ),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Redraws the plots of a saved run (`ptr1-bench plot`).
pub(crate) fn replot(from: &Path, out: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(from).with_context(|| format!("reading {}", from.display()))?;
    let results: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a suite's results.json", from.display()))?;
    if !results["cases"].is_array() {
        anyhow::bail!(
            "{} has no cases: not a suite's results.json",
            from.display()
        );
    }
    for path in write(&results, out)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The one-buffer cases of `mode`: a series per column, then one per peer. The local mailbox
/// copies nothing, so its "throughput" (message rate × size) is left off; its latency is not.
fn series(results: &Value, mode: &str, with_local: bool) -> Vec<Series> {
    let cases: Vec<&Value> = results["cases"]
        .as_array()
        .map(|cases| {
            cases
                .iter()
                .filter(|c| c["mode"] == mode && c["buffers"] == 1)
                .collect()
        })
        .unwrap_or_default();
    // The medians of `section[key]` (a column's or a peer's) over those cases, by size.
    let line = |section: &str, key: &str, name: &str, peer: bool| Series {
        name: name.to_owned(),
        points: cases
            .iter()
            .filter_map(|c| Some((c["size"].as_f64()?, c[section][key]["median"].as_f64()?)))
            .collect(),
        peer,
    };
    let columns = results["columns"].as_array().into_iter().flatten();
    let columns = columns
        .filter_map(|c| Some((c["key"].as_str()?, c["name"].as_str()?)))
        .filter(|(key, _)| with_local || *key != "local")
        .map(|(key, name)| line("columns", key, name, false));
    let peers = results["peers"]["measured"]
        .as_array()
        .into_iter()
        .flatten();
    let peers = peers
        .filter_map(Value::as_str)
        .map(|name| line("peers", name, name, true));
    columns
        .chain(peers)
        .filter(|s| !s.points.is_empty())
        .collect()
}

fn memcpy(results: &Value) -> Series {
    let points = results["references"]["memcpy_gb_per_s"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m["size"].as_f64()?, m["median"].as_f64()?)))
        .collect();
    Series {
        name: "memcpy (1 thread)".into(),
        points,
        peer: false,
    }
}

const COLOURS: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// One log-log plot: `series` as lines, `level` as a grey dashed line, the legend on the right.
fn draw(title: &str, unit: &str, series: &[Series], level: Option<(&str, f64)>) -> Result<String> {
    let points = || series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = decades(points().map(|p| p.0));
    let (y0, y1) = decades(points().map(|p| p.1).chain(level.map(|l| l.1)));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let (left, legend) = root.split_horizontally(710);
        let mut chart = ChartBuilder::on(&left)
            .caption(title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("message size")
            .y_desc(unit)
            .x_label_formatter(&|v| size_label(*v))
            .y_label_formatter(&|v| number(*v))
            .draw()?;
        let (mut solid, mut dashed) = (0usize, 0usize);
        let entry = |i: usize| 58 + 22 * i32::try_from(i).unwrap_or(0);
        legend.draw(&Text::new(
            "solid: from Rust (ptr1-bench) · dashed: from Python",
            (6, 30),
            ("sans-serif", 12),
        ))?;
        for (i, s) in series.iter().enumerate() {
            let count = if s.peer { &mut dashed } else { &mut solid };
            let colour = COLOURS[*count % COLOURS.len()];
            *count += 1;
            let style = colour.stroke_width(2);
            let (y, line) = (entry(i), vec![(10, entry(i)), (44, entry(i))]);
            if s.peer {
                chart.draw_series(DashedLineSeries::new(s.points.clone(), 7, 4, style))?;
                legend.draw(&DashedPathElement::new(line, 7, 4, style))?;
            } else {
                chart.draw_series(LineSeries::new(s.points.clone(), style))?;
                legend.draw(&PathElement::new(line, style))?;
            }
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
            legend.draw(&Text::new(s.name.as_str(), (52, y - 7), ("sans-serif", 13)))?;
        }
        if let Some((name, value)) = level {
            let grey = RGBColor(0x44, 0x44, 0x44).stroke_width(1);
            chart.draw_series(DashedLineSeries::new(
                vec![(x0, value), (x1, value)],
                8,
                5,
                grey,
            ))?;
            let y = entry(series.len());
            legend.draw(&DashedPathElement::new(vec![(10, y), (44, y)], 8, 5, grey))?;
            legend.draw(&Text::new(
                format!("{name} ({value:.2} {unit})"),
                (52, y - 7),
                ("sans-serif", 13),
            ))?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// Whole decades around the positive finite values, at least one decade wide.
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (1.0, 10.0);
    }
    let (a, b) = (lo.log10().floor(), hi.log10().ceil());
    (10f64.powf(a), 10f64.powf(if b > a { b } else { a + 1.0 }))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn results() -> Value {
        serde_json::json!({
            "columns": [{"key": "local", "name": "local mailbox"}, {"key": "engine", "name": "PTR1 io_uring"}],
            "cases": [
                {"mode": "oneway", "size": 4096, "buffers": 1,
                 "columns": {"local": {"median": 2.5}, "engine": {"median": 0.2}},
                 "peers": {"pyzmq": {"median": 0.03}}},
                {"mode": "oneway", "size": 67108864, "buffers": 1,
                 "columns": {"local": {"median": 9000.0}, "engine": {"median": 4.0}},
                 "peers": {"pyzmq": {"median": 1.2}}},
                {"mode": "oneway", "size": 67108864, "buffers": 16,
                 "columns": {"engine": {"median": 3.0}}, "peers": {}},
                {"mode": "rtt", "size": 4096, "buffers": 1,
                 "columns": {"local": {"median": 1.4}, "engine": {"median": 26.0}},
                 "peers": {"pyzmq": {"median": 120.0}}}
            ],
            "peers": {"measured": ["pyzmq"]},
            "references": {"iperf3_gb_per_s": {"median": 3.6},
                           "memcpy_gb_per_s": [{"size": 67108864, "median": 5.4}]}
        })
    }

    #[test]
    fn series_come_from_the_one_buffer_cases_in_the_tables_order() {
        let oneway = series(&results(), "oneway", false);
        let names: Vec<&str> = oneway.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["PTR1 io_uring", "pyzmq"],
            "no local mailbox throughput"
        );
        assert_eq!(oneway[0].points, [(4096.0, 0.2), (67_108_864.0, 4.0)]);
        assert!(oneway[1].peer && !oneway[0].peer);
        let rtt = series(&results(), "rtt", true);
        assert_eq!(rtt[0].name, "local mailbox");
    }

    #[test]
    fn the_plots_are_svg_with_every_series_named_and_a_reference_level() {
        let dir = std::env::temp_dir().join(format!("ptr1-bench-plots-{}", std::process::id()));
        let written = write(&results(), &dir).unwrap();
        let throughput = std::fs::read_to_string(&written[0]).unwrap();
        for name in [
            "PTR1 io_uring",
            "pyzmq",
            "memcpy (1 thread)",
            "iperf3 loopback (3.60 GB/s)",
        ] {
            assert!(throughput.contains(name), "{name} is in the legend");
        }
        assert!(throughput.starts_with("<svg") && throughput.trim_end().ends_with("</svg>"));
        let latency = std::fs::read_to_string(&written[1]).unwrap();
        assert!(latency.contains("local mailbox") && latency.contains("µs"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_file_that_is_not_a_suite_run_is_a_clear_error() {
        let path = std::env::temp_dir().join(format!("ptr1-bench-notjson-{}", std::process::id()));
        std::fs::write(&path, "{\"hello\": 1}").unwrap();
        let err = replot(&path, &std::env::temp_dir()).unwrap_err();
        assert!(
            format!("{err:#}").contains("not a suite's results.json"),
            "{err:#}"
        );
        let _ = std::fs::remove_file(path);
    }
}
