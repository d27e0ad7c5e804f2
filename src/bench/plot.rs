//! A bar chart of the phases' rates, one bar per run in each phase group, as
//! SVG. Text is left to the SVG viewer (`<text>` elements), so no font files
//! or font libraries are needed to draw it.

use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::RunReport;

/// One colour per run, in order (more runs reuse them).
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
/// Above this spread of rates a chart of several runs uses a log scale.
const LOG_SPREAD: f64 = 30.0;
const HEIGHT_PX: u32 = 480;

/// Draws `runs` (all of one workload) into the SVG file `path`.
pub fn draw(path: &Path, runs: &[RunReport]) -> Result<(), String> {
    let first = runs.first().ok_or("no run to plot")?;
    let w = first.workload;
    if let Some(r) = runs.iter().find(|r| r.workload != w) {
        return Err(format!("cannot chart {} next to {}", r.workload.name(), w.name()));
    }
    let phases: Vec<&str> = w.phases().iter().map(|p| p.name).collect();
    let values: Vec<Vec<Option<f64>>> = runs
        .iter()
        .map(|r| {
            let rate = |n: &str| r.phases.iter().find(|p| p.name == n).map(|p| p.rate);
            phases.iter().map(|n| rate(n)).collect()
        })
        .collect();
    let all = values.iter().flatten().flatten().copied().filter(|v| *v > 0.0);
    let (min, max) = all.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if max <= 0.0 {
        return Err("nothing to plot: no phase has a positive rate".into());
    }
    let width_px = (220 + phases.len() * (40 + 46 * runs.len())).max(640) as u32;
    let root = SVGBackend::new(path, (width_px, HEIGHT_PX)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let chart = Chart {
        caption: format!("pfs bench {}: {} procs, {}", w.name(), first.params.procs, first.sizes()),
        unit: w.metric().unit(),
        phases: &phases,
        runs,
        values: &values,
    };
    if runs.len() > 1 && max / min > LOG_SPREAD {
        let bottom = min / 2.0;
        chart.bars(&root, (bottom..max * 4.0).log_scale(), bottom)?;
    } else {
        chart.bars(&root, 0.0..max * 1.15, 0.0)?;
    }
    root.present().map_err(|e| format!("{}: {e}", path.display()))
}

/// What one chart shows.
struct Chart<'a> {
    caption: String,
    unit: &'static str,
    phases: &'a [&'a str],
    runs: &'a [RunReport],
    /// `values[run][phase]`.
    values: &'a [Vec<Option<f64>>],
}

impl Chart<'_> {
    fn bars<Y>(
        &self,
        root: &DrawingArea<SVGBackend<'_>, Shift>,
        y: Y,
        bottom: f64,
    ) -> Result<(), String>
    where
        Y: AsRangedCoord<Value = f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let err = |e: DrawingAreaErrorKind<std::io::Error>| e.to_string();
        let n = self.phases.len();
        let mut chart = ChartBuilder::on(root)
            .caption(&self.caption, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..n as f64, y)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n + 1)
            .x_label_formatter(&|_| String::new())
            .y_desc(self.unit)
            .y_label_formatter(&|v| short(*v))
            .draw()
            .map_err(err)?;
        let m = self.runs.len();
        let group = 0.8;
        let bar = group / m as f64;
        let label_style = TextStyle::from(("sans-serif", 11).into_font())
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        for (j, run) in self.runs.iter().enumerate() {
            let colour = COLOURS[j % COLOURS.len()];
            let bars: Vec<(f64, f64)> = (0..n)
                .filter_map(|i| self.values[j][i].map(|v| (i as f64 + 0.1 + bar * j as f64, v)))
                .collect();
            chart
                .draw_series(bars.iter().map(|&(x, v)| {
                    Rectangle::new([(x + bar * 0.05, bottom), (x + bar * 0.95, v)], colour.filled())
                }))
                .map_err(err)?
                .label(run.label.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled())
                });
            chart
                .draw_series(
                    bars.iter()
                        .map(|&(x, v)| Text::new(short(v), (x + bar / 2.0, v), &label_style)),
                )
                .map_err(err)?;
        }
        let name_style =
            TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        for (i, name) in self.phases.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(i as f64 + 0.5, bottom));
            root.draw(&Text::new(name.to_string(), (px, py + 8), &name_style)).map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        Ok(())
    }
}

/// A rate in few characters: `987`, `12.3k`, `4.56M`.
pub fn short(v: f64) -> String {
    match v {
        v if v >= 1e6 => format!("{:.3}M", v / 1e6),
        v if v >= 1e4 => format!("{:.1}k", v / 1e3),
        v if v >= 100.0 => format!("{v:.0}"),
        v if v >= 1.0 => format!("{v:.1}"),
        v => format!("{v:.3}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::proto::Outcome;
    use crate::bench::report::{PhaseReport, FORMAT_VERSION};
    use crate::bench::{Params, Workload};

    fn run(label: &str, scale: u64) -> RunReport {
        let w = Workload::MdHard;
        let phases = w
            .phases()
            .iter()
            .map(|p| {
                let o = Outcome {
                    items: 10 * scale,
                    ops: 10 * scale,
                    bytes: 0,
                    start_ns: 0,
                    end_ns: 1_000_000,
                };
                PhaseReport::new(p.name, w.metric(), false, &[o])
            })
            .collect();
        RunReport {
            format_version: FORMAT_VERSION,
            pfs_version: "0".into(),
            workload: w,
            label: label.into(),
            target: "/tmp".into(),
            target_kind: "posix".into(),
            started_unix_s: 0,
            params: Params {
                procs: 1,
                files: Some(10),
                size_bytes: Some(3901),
                transfer_bytes: None,
                segments: None,
                particles: None,
                window: None,
                time_s: None,
            },
            phases,
        }
    }

    #[test]
    fn charts_are_svg_with_every_phase_and_run() {
        let dir = std::env::temp_dir().join(format!("pfs-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, runs) in
            [("one", vec![run("tmpfs", 1)]), ("log", vec![run("tmpfs", 1000), run("pfs", 1)])]
        {
            let path = dir.join(format!("{name}.svg"));
            draw(&path, &runs).unwrap();
            let svg = std::fs::read_to_string(&path).unwrap();
            assert!(svg.starts_with("<svg"), "{name}");
            for text in ["create", "stat", "read", "remove", "ops/s", "tmpfs"] {
                assert!(svg.contains(text), "{name}: no {text:?} in the chart");
            }
            if runs.len() > 1 {
                // plotters writes each text element's content on a line of its own.
                assert!(svg.lines().any(|l| l.trim() == "pfs"), "{name}: legend");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn short_numbers() {
        assert_eq!(short(1_234_567.0), "1.235M");
        assert_eq!(short(12_345.0), "12.3k");
        assert_eq!(short(987.4), "987");
        assert_eq!(short(9.87), "9.9");
    }
}
